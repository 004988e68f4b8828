"""The flat batch: one step's SchedulerOutput as the tensors a paged forward pass reads.

Every scheduled request contributes its new tokens as consecutive rows; a sequence is one
request. This is a pure function of the SchedulerOutput (plus the page size, the device and
the runner's padding slot), so it can be replaced: `LLMEngine(..., batch_builder=fn)` makes the
model runner call `fn` instead, and the `slot_mapping` it returns is what writes the K/V.

Rows come in the order of `output.scheduled`, after `output.num_padded_tokens` padding rows
(static batching's finished passengers, which are computed anyway: one token each, at
position 0, writing to `pad_slot`, reading only itself). The runner hands the builder an
output whose single-token entries come first, which is the order its attention expects.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .scheduler.output import SchedulerOutput


@dataclass
class FlatBatch:
    token_ids: torch.Tensor  # long [T]: each row's token
    positions: torch.Tensor  # long [T]: each row's position in its sequence
    slot_mapping: torch.Tensor  # long [T]: where each row's K/V is written (page * page_size + offset)
    block_tables: torch.Tensor  # int32 [S, max_pages]: each sequence's pages; past its own pages: 0 (never read)
    seq_lens: torch.Tensor  # int32 [S]: tokens each sequence attends to (context + its new tokens)
    query_start_loc: torch.Tensor  # int32 [S + 1]: sequence s owns rows query_start_loc[s] .. [s + 1] - 1

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]


def build_flat_batch(output: SchedulerOutput, page_size: int, device="cpu", pad_slot: int = 0) -> FlatBatch:
    """The flat batch of `output` (see the module docstring for the row order)."""
    pad = output.num_padded_tokens
    ids, positions, slots = [0] * pad, [0] * pad, [pad_slot] * pad
    tables, seq_lens, starts = [(pad_slot // page_size,)] * pad, [1] * pad, list(range(pad + 1))
    end = pad
    for s in output.scheduled:
        n = s.num_new_tokens
        ids += s.token_ids
        positions += range(s.start, s.start + n)
        slots += s.slots(page_size)
        tables.append(s.page_ids)
        seq_lens.append(s.start + n)
        end += n
        starts.append(end)
    width = max(map(len, tables))
    return FlatBatch(
        token_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        block_tables=torch.tensor([[*t, *[0] * (width - len(t))] for t in tables], dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
    )
