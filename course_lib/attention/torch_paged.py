"""Vectorised paged attention in plain torch: gather each sequence's pages, mask, softmax.

GQA without copying K/V per query head: queries are viewed as [kv_heads, group, ...] and
broadcast against one K/V head each.
"""
from __future__ import annotations

import torch


def _gather_context(k_cache, v_cache, block_tables, max_len):
    """[num_seqs, max_len, num_kv_heads, head_dim] views of each sequence's first max_len slots."""
    page_size = k_cache.shape[1]
    num_pages_needed = (max_len + page_size - 1) // page_size
    pages = block_tables[:, :num_pages_needed].long()
    k = k_cache[pages].flatten(1, 2)[:, :max_len]
    v = v_cache[pages].flatten(1, 2)[:, :max_len]
    return k, v


def _masked_attention(q, k, v, mask, scale):
    """q: [S, Q, H, D]; k, v: [S, L, KVH, D]; mask: [S, Q, L] True where visible -> [S, Q, H, D]."""
    S, Q, H, D = q.shape
    kvh = k.shape[2]
    qg = q.view(S, Q, kvh, H // kvh, D).permute(0, 2, 3, 1, 4)  # [S, KVH, G, Q, D]
    kt = k.permute(0, 2, 3, 1)  # [S, KVH, D, L]
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(qg.to(compute), kt.unsqueeze(2).to(compute)) * scale  # [S, KVH, G, Q, L]
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # Slots outside the mask may hold garbage (even NaN): zero them so 0 * NaN never happens.
    vv = torch.where(mask.any(1)[:, :, None, None], v, torch.zeros((), dtype=v.dtype, device=v.device))
    out = torch.matmul(probs, vv.permute(0, 2, 1, 3).unsqueeze(2).to(compute))  # [S, KVH, G, Q, D]
    return out.permute(0, 3, 1, 2, 4).reshape(S, Q, H, D).to(q.dtype)


def paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale):
    max_len = int(seq_lens.max())
    k, v = _gather_context(k_cache, v_cache, block_tables, max_len)
    mask = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)
    return _masked_attention(q[:, None], k, v, mask[:, None, :], scale)[:, 0]


def paged_prefill_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale):
    device = q.device
    starts = query_start_loc.to(device).long()
    counts = starts[1:] - starts[:-1]
    num_seqs, max_q = counts.numel(), int(counts.max())
    max_len = int(seq_lens.max())
    k, v = _gather_context(k_cache, v_cache, block_tables, max_len)
    # Pad the ragged queries into [S, max_q]: row j of sequence s is query starts[s] + j.
    j = torch.arange(max_q, device=device)
    valid_q = j[None, :] < counts[:, None]
    rows = (starts[:-1, None] + j[None, :]).clamp(max=q.shape[0] - 1)
    qp = q[rows]
    positions = seq_lens[:, None].to(device).long() - counts[:, None] + j[None, :]  # absolute position
    mask = torch.arange(max_len, device=device)[None, None, :] <= positions[:, :, None]
    mask = mask & valid_q[:, :, None]
    mask[:, :, 0] |= ~valid_q  # padded query rows see one token so their softmax stays finite
    out = _masked_attention(qp, k, v, mask, scale)
    return out[valid_q]
