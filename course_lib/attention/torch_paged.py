"""Vectorised paged attention in plain torch: gather each sequence's tokens, mask, softmax.

Written to stay within a small factor of attention over a contiguous cache:

- **One gather per KV-head chunk, straight into matmul layout.** Context position `t` of a
  sequence lives in the physical slot `page * page_size + row`; seen as rows of `head_dim`
  values, its KV head `h` is row `slot * num_kv_heads + h`. Gathering the rows in (head,
  sequence, position) order gives K (and V) as `[heads * seqs, max_len, head_dim]`, contiguous,
  ready for one batched matmul over every (head, sequence) pair. We gather as many KV heads at
  a time as fit in `GATHER_BYTES` and use them while they are still in cache. (Gathering the
  whole context in one go writes, then re-reads, a copy of it through main memory; on a GPU the
  budget also bounds the temporary memory.)
- **GQA as a bigger matrix, not a broadcast.** The `group` query heads that share a KV head are
  the rows of one `[group * queries, head_dim]` matrix. (Broadcasting K over a group dimension
  instead makes `matmul` materialise K `group` times.)
- **Positions past `seq_len` read a real token.** Slots beyond a sequence's length may hold
  garbage, even NaN, and a masked softmax weight of 0 times NaN is still NaN. So those positions
  gather the sequence's own token 0 (always finite), and the mask gives them weight 0.
- **Plan once per step.** Which slots to gather and what to mask depends only on the block
  tables and sequence lengths, which every layer of a step shares. `plan_decode` /
  `plan_prefill` compute it; the engine's runner makes one plan per step and hands it to each
  layer (`plan=`), so the layers only gather and multiply. Called without a plan, the functions
  make their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GATHER_BYTES = 2 * 2**20  # per gathered K (and V) chunk: about what a CPU core keeps in L2


@dataclass
class AttentionPlan:
    """What one step's attention reads, shared by all its layers.

    rows: [S * L] the cache row (slot * num_kv_heads) of KV head 0 for each (sequence, position);
    hidden: [S, 1, Q, L] True where a query must not look (broadcast over the query-head group),
    or None when every query sees every position (a decode batch of equal lengths);
    heads_per_gather: how many KV heads one gather takes (see GATHER_BYTES);
    query_rows / valid_queries: prefill only, how the ragged queries pad into [S, Q]."""

    num_seqs: int
    max_len: int
    num_kv_heads: int
    rows: torch.Tensor
    hidden: torch.Tensor | None
    heads_per_gather: int
    query_rows: torch.Tensor | None = None
    valid_queries: torch.Tensor | None = None
    _all_heads: torch.Tensor | None = None  # the full gather index, when one chunk holds every head

    def gather_index(self, first: int, last: int) -> torch.Tensor:
        """Cache rows of KV heads first..last-1 for every (sequence, position), head-major."""
        if first == 0 and last == self.num_kv_heads and self._all_heads is not None:
            return self._all_heads
        heads = torch.arange(first, last, device=self.rows.device)
        return (heads[:, None] + self.rows[None, :]).reshape(-1)


def _context_rows(block_tables, seq_lens, max_len, page_size, num_kv_heads):
    """([S * L] cache row of KV head 0 for each context position, [S, L] True inside the
    sequence). Positions >= seq_len point at the sequence's token 0, so nothing outside the
    sequence is ever read (table entries past its last page may hold anything)."""
    device = block_tables.device
    t = torch.arange(max_len, device=device)
    pages = block_tables[:, :(max_len + page_size - 1) // page_size].long()
    slots = pages[:, t // page_size] * page_size + t % page_size
    inside = t[None, :] < seq_lens[:, None].to(device)
    slots = torch.where(inside, slots, slots[:, :1])
    return (slots * num_kv_heads).reshape(-1), inside


def _finish_plan(num_seqs, max_len, num_kv_heads, rows, hidden, head_dim, element_size, **extra):
    # Nothing to hide (equal lengths, all decodes): skip the mask in every layer. Asked once per
    # step, so the host sync this costs on a GPU is paid once, not per layer.
    hidden = hidden if bool(hidden.any()) else None
    per_gather = _heads_per_gather(num_seqs, max_len, num_kv_heads, head_dim, element_size)
    plan = AttentionPlan(num_seqs, max_len, num_kv_heads, rows, hidden, per_gather, **extra)
    if per_gather >= num_kv_heads:
        plan._all_heads = plan.gather_index(0, num_kv_heads)
    return plan


def _heads_per_gather(num_seqs, max_len, num_kv_heads, head_dim, element_size):
    # As many KV heads per gather as fit the budget (all of them for a small batch: fewer ops).
    return max(1, min(num_kv_heads, GATHER_BYTES // max(1, num_seqs * max_len * head_dim * element_size)))


def plan_decode(k_cache, block_tables, seq_lens) -> AttentionPlan:
    num_pages, page_size, kvh, head_dim = k_cache.shape
    max_len = int(seq_lens.max())
    rows, inside = _context_rows(block_tables, seq_lens, max_len, page_size, kvh)
    hidden = ~inside[:, None, None, :].to(k_cache.device)
    return _finish_plan(block_tables.shape[0], max_len, kvh, rows.to(k_cache.device), hidden, head_dim,
                        k_cache.element_size())


def plan_prefill(k_cache, block_tables, query_start_loc, seq_lens) -> AttentionPlan:
    num_pages, page_size, kvh, head_dim = k_cache.shape
    device = k_cache.device
    starts = query_start_loc.to(device).long()
    counts = starts[1:] - starts[:-1]
    max_q, max_len = int(counts.max()), int(seq_lens.max())
    rows, _ = _context_rows(block_tables, seq_lens, max_len, page_size, kvh)
    # Pad the ragged queries into [S, max_q]: row j of sequence s is query starts[s] + j.
    j = torch.arange(max_q, device=device)
    valid_q = j[None, :] < counts[:, None]
    query_rows = (starts[:-1, None] + j[None, :]).clamp(max=max(int(starts[-1]) - 1, 0))
    positions = seq_lens[:, None].to(device).long() - counts[:, None] + j[None, :]  # absolute position
    visible = torch.arange(max_len, device=device)[None, None, :] <= positions[:, :, None]
    visible &= valid_q[:, :, None]
    visible[:, :, 0] |= ~valid_q  # padded query rows see one token so their softmax stays finite
    return _finish_plan(counts.numel(), max_len, kvh, rows.to(device), ~visible[:, None], head_dim,
                        k_cache.element_size(), query_rows=query_rows, valid_queries=valid_q)


def _attend(q, k_cache, v_cache, plan: AttentionPlan, scale):
    """q: [S, Q, H, D] -> [S, Q, H, D], reading each sequence's context through `plan`."""
    S, Q, H, D = q.shape
    kvh, L = plan.num_kv_heads, plan.max_len
    group = H // kvh
    compute = torch.promote_types(q.dtype, torch.float32)
    rows_k = k_cache.view(-1, D)  # one row per (slot, KV head)
    rows_v = v_cache.view(-1, D)
    # Rows of KV head h's query matrix: (query head in the group, query token). The softmax
    # scale is applied here, to the few queries, rather than to the many scores.
    qg = q.reshape(S, Q, kvh, group, D).permute(2, 0, 3, 1, 4).reshape(kvh * S, group * Q, D)
    qg = (qg if qg.dtype == compute else qg.to(compute)) * scale
    out = torch.empty(kvh * S, group * Q, D, dtype=compute, device=q.device)
    for first in range(0, kvh, plan.heads_per_gather):
        last = min(first + plan.heads_per_gather, kvh)
        index = plan.gather_index(first, last)
        k = rows_k.index_select(0, index).view((last - first) * S, L, D)
        v = rows_v.index_select(0, index).view((last - first) * S, L, D)
        if k.dtype != compute:
            k, v = k.to(compute), v.to(compute)
        chunk = slice(first * S, last * S)
        scores = torch.bmm(qg[chunk], k.transpose(1, 2))  # [heads * S, G*Q, L]
        if plan.hidden is not None:
            scores.view(last - first, S, group, Q, L).masked_fill_(plan.hidden, float("-inf"))
        torch.bmm(torch.softmax(scores, dim=-1), v, out=out[chunk])
    out = out.view(kvh, S, group, Q, D).permute(1, 3, 0, 2, 4).reshape(S, Q, H, D)
    return out if out.dtype == q.dtype else out.to(q.dtype)


def paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, plan: AttentionPlan | None = None):
    plan = plan if plan is not None else plan_decode(k_cache, block_tables, seq_lens)
    return _attend(q[:, None], k_cache, v_cache, plan, scale)[:, 0]


def paged_prefill_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                        plan: AttentionPlan | None = None):
    plan = plan if plan is not None else plan_prefill(k_cache, block_tables, query_start_loc, seq_lens)
    out = _attend(q[plan.query_rows], k_cache, v_cache, plan, scale)
    return out[plan.valid_queries]
