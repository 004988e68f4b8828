"""Paged attention with explicit loops: page by page, token by token, the way it is taught.

Correct and slow. Every other backend is tested against it (and against a dense oracle).
"""
from __future__ import annotations

import math

import torch


def _attend_one(query, k_cache, v_cache, pages, context_len, scale):
    """query: [num_heads, head_dim], attending to the first `context_len` tokens of the sequence
    whose physical pages are `pages`. A plain (not online) softmax over gathered scores."""
    num_heads = query.shape[0]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    for h in range(num_heads):
        kv_head = h // group  # the query heads of a group share one KV head (GQA / MQA)
        scores, values = [], []
        for t in range(context_len):
            page, row = pages[t // page_size], t % page_size
            key = k_cache[page, row, kv_head].to(torch.float32 if query.dtype != torch.float64 else query.dtype)
            scores.append(float((query[h].to(key.dtype) * key).sum()) * scale)
            values.append(v_cache[page, row, kv_head])
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        acc = torch.zeros_like(values[0], dtype=torch.float64)
        for w, val in zip(weights, values):
            acc += (w / total) * val.to(torch.float64)
        out[h] = acc.to(query.dtype)
    return out


def paged_decode_reference(q, k_cache, v_cache, block_tables, seq_lens, scale):
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        out[s] = _attend_one(q[s], k_cache, v_cache, block_tables[s].tolist(), int(seq_lens[s]), scale)
    return out


def paged_prefill_reference(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale):
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for s in range(len(starts) - 1):
        n, total = starts[s + 1] - starts[s], int(seq_lens[s])
        pages = block_tables[s].tolist()
        for j in range(n):
            position = total - n + j  # causal: this query sees tokens 0..position
            out[starts[s] + j] = _attend_one(q[starts[s] + j], k_cache, v_cache, pages, position + 1, scale)
    return out
