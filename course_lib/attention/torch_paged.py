"""Vectorised paged attention in plain torch: gather each sequence's tokens, mask, softmax.

Written to stay within a small factor of attention over a contiguous cache:

- **Gather by slot, a few KV heads at a time.** Context position `t` of a sequence lives in the
  physical slot `page * page_size + row`. We gather the keys (and values) of every
  (sequence, position) for as many KV heads as fit in `GATHER_BYTES` and use them at once, while
  they are still in cache. (Gathering the whole context in one go writes, then re-reads, a copy
  of it through main memory: about three times the traffic of contiguous attention. On a GPU the
  budget also bounds the temporary memory.)
- **GQA as a bigger matrix, not a broadcast.** The `group` query heads that share a KV head are
  the rows of one `[group * queries, head_dim]` matrix, so each KV head is one batched matmul
  over sequences, reading the gathered keys in place (strided, no copy). (Broadcasting K over a
  group dimension instead makes `matmul` materialise K `group` times.)
- **Positions past `seq_len` read a real token.** Slots beyond a sequence's length may hold
  garbage, even NaN, and a masked softmax weight of 0 times NaN is still NaN. So those positions
  gather the sequence's own token 0 (always finite), and the mask gives them weight 0.
"""
from __future__ import annotations

import torch


def _context_slots(block_tables, seq_lens, max_len, page_size):
    """([num_seqs, max_len] physical slot of each context position, [num_seqs, max_len] True
    inside the sequence). Positions >= seq_len point at the sequence's token 0, so nothing
    outside the sequence is ever read."""
    device = block_tables.device
    t = torch.arange(max_len, device=device)
    pages = block_tables[:, :(max_len + page_size - 1) // page_size].long()
    slots = pages[:, t // page_size] * page_size + t % page_size
    inside = t[None, :] < seq_lens[:, None].to(device)
    return torch.where(inside, slots, slots[:, :1]), inside


GATHER_BYTES = 2 * 2**20  # per gathered K (and V) chunk: about what a CPU core keeps in L2


def _attend(q, k_cache, v_cache, slots, mask, scale):
    """q: [S, Q, H, D]; slots: [S, L] (all of them the sequence's own tokens);
    mask: [S, Q, L] True where visible -> [S, Q, H, D]."""
    S, Q, H, D = q.shape
    num_pages, page_size, kvh, _ = k_cache.shape
    L, group = slots.shape[1], H // kvh
    compute = torch.promote_types(q.dtype, torch.float32)
    flat_k = k_cache.view(num_pages * page_size, kvh, D)
    flat_v = v_cache.view(num_pages * page_size, kvh, D)
    index = slots.reshape(-1).to(k_cache.device)
    # Rows of KV head h's query matrix: (query head in the group, query token). The softmax
    # scale is applied here, to the few queries, rather than to the many scores.
    qg = q.view(S, Q, kvh, group, D).permute(2, 0, 3, 1, 4).reshape(kvh, S, group * Q, D).to(compute) * scale
    hidden = ~mask[:, None]  # [S, 1, Q, L], broadcast over the group
    out = torch.empty(kvh, S, group * Q, D, dtype=compute, device=q.device)
    # As many KV heads per gather as fit the budget (all of them for a small batch: fewer ops).
    per_gather = max(1, min(kvh, GATHER_BYTES // max(1, S * L * D * k_cache.element_size())))
    for first in range(0, kvh, per_gather):
        heads = slice(first, min(first + per_gather, kvh))
        k = flat_k[:, heads].index_select(0, index).view(S, L, -1, D).to(compute)
        v = flat_v[:, heads].index_select(0, index).view(S, L, -1, D).to(compute)
        for j, h in enumerate(range(heads.start, heads.stop)):
            scores = torch.bmm(qg[h], k[:, :, j].transpose(1, 2))  # [S, G*Q, L]
            scores.view(S, group, Q, L).masked_fill_(hidden, float("-inf"))
            torch.bmm(torch.softmax(scores, dim=-1), v[:, :, j], out=out[h])
    return out.view(kvh, S, group, Q, D).permute(1, 3, 0, 2, 4).reshape(S, Q, H, D).to(q.dtype)


def paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale):
    max_len = int(seq_lens.max())
    slots, inside = _context_slots(block_tables, seq_lens, max_len, k_cache.shape[1])
    return _attend(q[:, None], k_cache, v_cache, slots, inside[:, None, :].to(q.device), scale)[:, 0]


def paged_prefill_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale):
    device = q.device
    starts = query_start_loc.to(device).long()
    counts = starts[1:] - starts[:-1]
    num_seqs, max_q = counts.numel(), int(counts.max())
    max_len = int(seq_lens.max())
    slots, _ = _context_slots(block_tables, seq_lens, max_len, k_cache.shape[1])
    # Pad the ragged queries into [S, max_q]: row j of sequence s is query starts[s] + j.
    j = torch.arange(max_q, device=device)
    valid_q = j[None, :] < counts[:, None]
    rows = (starts[:-1, None] + j[None, :]).clamp(max=q.shape[0] - 1)
    qp = q[rows]
    positions = seq_lens[:, None].to(device).long() - counts[:, None] + j[None, :]  # absolute position
    mask = torch.arange(max_len, device=device)[None, None, :] <= positions[:, :, None]
    mask = mask & valid_q[:, :, None]
    mask[:, :, 0] |= ~valid_q  # padded query rows see one token so their softmax stays finite
    out = _attend(qp, k_cache, v_cache, slots, mask, scale)
    return out[valid_q]
