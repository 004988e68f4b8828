"""Notebook 01 static_batching: reference solutions. GENERATED from solutions/01_static_batching/01_static_batching.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


from course_lib.course import checking, fast_mode, padded_forward, setup_torch, use_or_reference
import torch
from course_lib.model.contiguous_cache import ContiguousKVCache


def pad_batch(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad `prompts` into ids [B, L] (long) and a mask [B, L] (bool, True on real tokens)."""
    if not prompts:
        raise ValueError("pad_batch needs at least one prompt, got an empty list")
    empty = [row for row, prompt in enumerate(prompts) if len(prompt) == 0]
    if empty:
        raise ValueError(f"prompt(s) {empty} are empty: a prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):  # right-align the real tokens
        ids[row, longest - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, longest - len(prompt):] = True
    return ids, mask


def static_generate(model, prompts: list[list[int]], max_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy static batching: the whole batch decodes until every row is done (or max_tokens)."""
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask = pad_batch(prompts, pad_id)
    outputs = [[] for _ in prompts]
    finished = [False] * len(prompts)
    for _ in range(max_tokens):
        next_tokens = padded_forward(model, ids, mask)[:, -1].argmax(dim=-1).tolist()
        column, column_mask = [], []
        for row, token in enumerate(next_tokens):
            if finished[row]:  # a finished passenger keeps its seat as padding
                column.append(pad_id)
                column_mask.append(False)
                continue
            outputs[row].append(token)
            finished[row] = token == eos_id
            column.append(token)
            column_mask.append(True)
        if all(finished):
            break
        ids = torch.cat([ids, torch.tensor(column, dtype=torch.long)[:, None]], dim=1)
        mask = torch.cat([mask, torch.tensor(column_mask, dtype=torch.bool)[:, None]], dim=1)
    return outputs


def static_generate_cached(model, prompts: list[list[int]], max_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy static batching over a contiguous KV cache: one prefill pass, then one token per row and step."""
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask = pad_batch(prompts, pad_id)
    cache = ContiguousKVCache(model, batch_size=len(prompts), max_len=ids.shape[1] + max_tokens)
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    next_position = mask.sum(dim=1)  # a row's next token sits right after its real tokens
    outputs = [[] for _ in prompts]
    finished = [False] * len(prompts)
    for step in range(max_tokens):
        next_tokens = cache.forward(model, ids, mask, positions)[:, -1].argmax(dim=-1).tolist()
        running = [not done for done in finished]
        for row, token in enumerate(next_tokens):
            if running[row]:
                outputs[row].append(token)
                finished[row] = token == eos_id
        if all(finished) or step == max_tokens - 1:
            break
        # The next pass feeds one column: each running row's new token, padding for the finished ones.
        ids = torch.tensor([[t if r else pad_id] for t, r in zip(next_tokens, running)], dtype=torch.long)
        mask = torch.tensor(running, dtype=torch.bool)[:, None]
        positions = next_position[:, None].clone()
        next_position = next_position + mask[:, 0].long()
    return outputs


def padding_waste(prompt_lens: list[int], output_lens: list[int]) -> float:
    """Fraction of the computed token slots of one static batch that are padding."""
    if not prompt_lens or len(prompt_lens) != len(output_lens):
        raise ValueError(f"need one output length per prompt length (and at least one request): got "
                         f"{len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths")
    if min(prompt_lens) < 1 or min(output_lens) < 1:
        raise ValueError(f"every request has >= 1 prompt token and >= 1 output token, got {prompt_lens}, {output_lens}")
    batch = len(prompt_lens)
    prefill_slots = batch * max(prompt_lens)
    decode_slots = batch * (max(output_lens) - 1)
    real = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    total = prefill_slots + decode_slots
    return (total - real) / total
