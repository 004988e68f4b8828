"""Vectorised paged attention in plain torch: gather each sequence's tokens, mask, softmax.

Written to stay within a small factor of attention over a contiguous cache:

- **One gather per chunk of sequences, straight into matmul layout.** Context position `t` of
  a sequence lives in the physical slot `page * page_size + row`; seen as rows of `head_dim`
  values, its KV head `h` is row `slot * num_kv_heads + h`. Gathering the rows in (sequence,
  head, position) order gives K (and V) as `[seqs * heads, max_len, head_dim]`, contiguous,
  ready for one batched matmul over every (sequence, KV head) pair. We gather as many sequences
  at a time as fit in `GATHER_BYTES` and use them while they are still in cache. (Gathering the
  whole context in one go writes, then re-reads, a copy of it through main memory; on a GPU the
  budget also bounds the temporary memory.)
- **GQA as a bigger matrix, not a broadcast.** The `group` query heads that share a KV head are
  the rows of one `[group * queries, head_dim]` matrix. (Broadcasting K over a group dimension
  instead makes `matmul` materialise K `group` times.) Query heads are numbered group by group,
  so for a decode step `q [seqs, heads, head_dim]` already *is* `[seqs * kv_heads, group,
  head_dim]`, and so is the output: no transposes, which at small batches cost as much as the
  matmuls.
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

    index: [S * num_kv_heads * L] the cache row (slot * num_kv_heads + head) to read for each
    (sequence, KV head, position), in that order;
    hidden: [S, 1, 1, Q, L] True where a query must not look (broadcast over KV heads and the
    query-head group), or None when every query sees every position (a decode batch of equal
    lengths);
    seqs_per_gather: how many sequences one gather takes (see GATHER_BYTES);
    query_rows / valid_queries: prefill only, how the ragged queries pad into [S, Q]."""

    num_seqs: int
    max_len: int
    num_kv_heads: int
    index: torch.Tensor
    hidden: torch.Tensor | None
    seqs_per_gather: int
    query_rows: torch.Tensor | None = None
    valid_queries: torch.Tensor | None = None


def _context_index(block_tables, seq_lens, max_len, page_size, num_kv_heads):
    """([S * KV * L] cache row of every (sequence, KV head, position), [S, L] True inside the
    sequence). Positions >= seq_len point at the sequence's token 0, so nothing outside the
    sequence is ever read (table entries past its last page may hold anything)."""
    device = block_tables.device
    t = torch.arange(max_len, device=device)
    pages = block_tables[:, :(max_len + page_size - 1) // page_size].long()
    slots = pages[:, t // page_size] * page_size + t % page_size
    inside = t[None, :] < seq_lens[:, None].to(device)
    slots = torch.where(inside, slots, slots[:, :1])
    heads = torch.arange(num_kv_heads, device=device)
    index = slots[:, None, :] * num_kv_heads + heads[None, :, None]
    return index.reshape(-1), inside


def _finish_plan(num_seqs, max_len, num_kv_heads, index, hidden, head_dim, element_size, **extra):
    # Nothing to hide (equal lengths, all decodes): skip the mask in every layer. Asked once per
    # step, so the host sync this costs on a GPU is paid once, not per layer.
    hidden = hidden if bool(hidden.any()) else None
    per_gather = _seqs_per_gather(max_len, num_kv_heads, head_dim, element_size)
    return AttentionPlan(num_seqs, max_len, num_kv_heads, index, hidden, per_gather, **extra)


def _seqs_per_gather(max_len, num_kv_heads, head_dim, element_size):
    # As many sequences per gather as fit the budget (all of them for a small batch: fewer ops).
    return max(1, GATHER_BYTES // max(1, max_len * num_kv_heads * head_dim * element_size))


def plan_decode(k_cache, block_tables, seq_lens) -> AttentionPlan:
    num_pages, page_size, kvh, head_dim = k_cache.shape
    max_len = int(seq_lens.max())
    index, inside = _context_index(block_tables, seq_lens, max_len, page_size, kvh)
    hidden = ~inside[:, None, None, None, :].to(k_cache.device)
    return _finish_plan(block_tables.shape[0], max_len, kvh, index.to(k_cache.device), hidden, head_dim,
                        k_cache.element_size())


def plan_prefill(k_cache, block_tables, query_start_loc, seq_lens) -> AttentionPlan:
    num_pages, page_size, kvh, head_dim = k_cache.shape
    device = k_cache.device
    starts = query_start_loc.to(device).long()
    counts = starts[1:] - starts[:-1]
    max_q, max_len = int(counts.max()), int(seq_lens.max())
    index, _ = _context_index(block_tables, seq_lens, max_len, page_size, kvh)
    # Pad the ragged queries into [S, max_q]: row j of sequence s is query starts[s] + j.
    j = torch.arange(max_q, device=device)
    valid_q = j[None, :] < counts[:, None]
    query_rows = (starts[:-1, None] + j[None, :]).clamp(max=max(int(starts[-1]) - 1, 0))
    positions = seq_lens[:, None].to(device).long() - counts[:, None] + j[None, :]  # absolute position
    visible = torch.arange(max_len, device=device)[None, None, :] <= positions[:, :, None]
    visible &= valid_q[:, :, None]
    visible[:, :, 0] |= ~valid_q  # padded query rows see one token so their softmax stays finite
    return _finish_plan(counts.numel(), max_len, kvh, index.to(device), ~visible[:, None, None], head_dim,
                        k_cache.element_size(), query_rows=query_rows, valid_queries=valid_q)


def _attend(q, k_cache, v_cache, plan: AttentionPlan, scale):
    """q: [S, Q, H, D], or [S, H, D] for one query each (decode) -> the same shape, reading each
    sequence's context through `plan`."""
    shape, dtype = q.shape, q.dtype
    S, H, D = shape[0], shape[-2], shape[-1]
    Q = shape[1] if q.dim() == 4 else 1
    kvh, L = plan.num_kv_heads, plan.max_len
    group = H // kvh
    compute = torch.promote_types(q.dtype, torch.float32)
    rows_k = k_cache.view(-1, D)  # one row per (slot, KV head)
    rows_v = v_cache.view(-1, D)
    # The query matrix of (sequence s, KV head h): its group's query heads x the query tokens.
    # The softmax scale is applied here, to the few queries, rather than to the many scores; the
    # multiplication also lays a strided q (a view into a fused projection) out densely.
    if Q > 1:
        q = q.reshape(S, Q, kvh, group, D).permute(0, 2, 3, 1, 4)
    qg = ((q if dtype == compute else q.to(compute)) * scale).reshape(S * kvh, group * Q, D)
    per = plan.seqs_per_gather
    # The usual case, every sequence in one gather, skips the slicing ops.
    out = None if per >= S else torch.empty(S * kvh, group * Q, D, dtype=compute, device=q.device)
    for first in range(0, S, per):
        last = min(first + per, S)
        rows = slice(first * kvh, last * kvh)
        index = plan.index if out is None else plan.index[first * kvh * L : last * kvh * L]
        k = rows_k.index_select(0, index).view((last - first) * kvh, L, D)
        v = rows_v.index_select(0, index).view((last - first) * kvh, L, D)
        if k.dtype != compute:
            k, v = k.to(compute), v.to(compute)
        scores = torch.bmm(qg if out is None else qg[rows], k.transpose(1, 2))  # [seqs * kvh, G*Q, L]
        if plan.hidden is not None:
            hidden = plan.hidden if out is None else plan.hidden[first:last]
            scores.view(last - first, kvh, group, Q, L).masked_fill_(hidden, float("-inf"))
        if out is None:
            out = torch.bmm(torch.softmax(scores, dim=-1), v)
        else:
            torch.bmm(torch.softmax(scores, dim=-1), v, out=out[rows])
    if Q > 1:
        out = out.view(S, kvh, group, Q, D).permute(0, 3, 1, 2, 4)
    out = out.reshape(shape)
    return out if dtype == compute else out.to(dtype)


def paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, plan: AttentionPlan | None = None):
    plan = plan if plan is not None else plan_decode(k_cache, block_tables, seq_lens)
    return _attend(q, k_cache, v_cache, plan, scale)


def paged_prefill_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                        plan: AttentionPlan | None = None):
    plan = plan if plan is not None else plan_prefill(k_cache, block_tables, query_start_loc, seq_lens)
    out = _attend(q[plan.query_rows], k_cache, v_cache, plan, scale)
    return out[plan.valid_queries]
