"""The naive padded static batcher, as notebook 1 builds it: course_lib's own version of the pieces
the student writes there (and what later cells fall back to while theirs is unfinished).

    pad_batch(prompts, pad_id)                              -> (ids [B, L] long, mask [B, L] bool)
    static_generate(model, prompts, max_tokens, eos_id)         no cache: the rectangle recomputed each step
    static_generate_cached(model, prompts, max_tokens, eos_id)  prefill once, then one column per step
    padding_waste(prompt_lens, output_lens)                 -> fraction of computed slots that are padding

The engine's real static scheduler is course_lib/scheduler/static.py; these are the textbook loop
over a rectangle, kept short enough to read next to the notebook.
"""
from __future__ import annotations

import torch

from .course import padded_forward
from .model.contiguous_cache import ContiguousKVCache


def pad_batch(prompts, pad_id: int):
    """Left-pad `prompts` into ids `[B, L]` (long) and a mask `[B, L]` (bool, True on real tokens)."""
    if len(prompts) == 0:
        raise ValueError("pad_batch needs at least one prompt, got none")
    for row, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {row} is empty: a prompt needs at least one token to predict from")
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], dtype=torch.bool)
    return ids, mask


def _pad_id(model) -> int:
    pad = model.config.pad_token_id
    return 0 if pad is None else pad


class _Rows:
    """Each row's generated ids, and whether it is done (EOS seen, or max_tokens reached)."""

    def __init__(self, n: int, max_tokens: int, eos_id: int):
        self.outputs: list[list[int]] = [[] for _ in range(n)]
        self.done = [False] * n
        self.max_tokens, self.eos_id = max_tokens, eos_id

    def take(self, tokens: list[int]) -> list[bool]:
        """Record one token per row; returns which rows were still live (took theirs)."""
        live = [not d for d in self.done]
        for row, token in enumerate(tokens):
            if live[row]:
                self.outputs[row].append(token)
                self.done[row] = token == self.eos_id or len(self.outputs[row]) >= self.max_tokens
        return live

    @property
    def all_done(self) -> bool:
        return all(self.done)


def static_generate(model, prompts, max_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy static batching with no cache: every step runs the whole padded rectangle again."""
    pad = _pad_id(model)
    ids, mask = pad_batch(prompts, pad)
    rows = _Rows(len(prompts), max_tokens, eos_id)
    while True:
        tokens = padded_forward(model, ids, mask)[:, -1].argmax(-1).tolist()
        live = rows.take(tokens)
        if rows.all_done:
            return rows.outputs
        column = torch.tensor([t if ok else pad for t, ok in zip(tokens, live)], dtype=torch.long)
        ids = torch.cat([ids, column[:, None]], dim=1)
        mask = torch.cat([mask, torch.tensor(live)[:, None]], dim=1)


def static_generate_cached(model, prompts, max_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy static batching over a contiguous KV cache: one prefill pass of the padded batch,
    then every step feeds one new column (each row's last token) and reads the rest from the cache."""
    pad = _pad_id(model)
    ids, mask = pad_batch(prompts, pad)
    cache = ContiguousKVCache(model, batch_size=ids.shape[0], max_len=ids.shape[1] + max_tokens)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    next_position = mask.sum(1)  # each row's real length: where its next token sits
    rows = _Rows(len(prompts), max_tokens, eos_id)
    while True:
        tokens = cache.forward(model, ids, mask, positions)[:, -1].argmax(-1).tolist()
        live = rows.take(tokens)
        if rows.all_done:
            return rows.outputs
        ids = torch.tensor([[t if ok else pad] for t, ok in zip(tokens, live)], dtype=torch.long)
        mask = torch.tensor(live)[:, None]
        positions = next_position[:, None].clone()
        next_position = next_position + mask[:, 0].long()


def padding_waste(prompt_lens, output_lens) -> float:
    """Fraction of the token slots one static batch computes that are padding: the prefill pads
    every prompt to the longest (and yields each row's first token), then every row decodes until
    the longest output is done."""
    if len(prompt_lens) == 0 or len(prompt_lens) != len(output_lens):
        raise ValueError(f"need one output length per prompt length (and at least one request), got "
                         f"{len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths")
    if min(prompt_lens) < 1 or min(output_lens) < 1:
        raise ValueError("every prompt has at least 1 token and every request at least 1 output token "
                         f"(the prefill's), got prompt_lens={list(prompt_lens)}, output_lens={list(output_lens)}")
    rows = len(prompt_lens)
    computed = rows * max(prompt_lens) + rows * (max(output_lens) - 1)
    real = sum(prompt_lens) + sum(output_lens) - rows
    return (computed - real) / computed
