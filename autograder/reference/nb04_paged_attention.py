"""Notebook 04 (paged attention): decode attention that reads K/V through block tables."""
import math

import torch


def paged_attention_loops(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """q: [num_seqs, num_heads, head_dim]; caches: [num_pages, page_size, num_kv_heads, head_dim];
    block_tables: int32 [num_seqs, max_pages]; seq_lens: int32 [num_seqs].
    Sequence s's token t is in page block_tables[s, t // page_size], row t % page_size; its query
    attends to tokens 0 .. seq_lens[s] - 1. Query head h reads KV head h // (num_heads // num_kv_heads)."""
    num_seqs, num_heads, _ = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(num_seqs):
        pages = block_tables[s].tolist()
        length = int(seq_lens[s])
        for h in range(num_heads):
            kv_head = h // group
            scores, values = [], []
            for t in range(length):
                page, row = pages[t // page_size], t % page_size
                key = k_cache[page, row, kv_head]
                scores.append(float((q[s, h].double() * key.double()).sum()) * scale)
                values.append(v_cache[page, row, kv_head].double())
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            acc = torch.zeros_like(values[0])
            for w, value in zip(weights, values):
                acc += (w / total) * value
            out[s, h] = acc.to(q.dtype)
    return out


def paged_attention_vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Same contract, no Python loop over tokens: gather every sequence's pages at once, mask the
    slots past its length, softmax, weighted sum. GQA by viewing the query heads as
    [num_kv_heads, group] so each group broadcasts against its one KV head."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    num_pages = -(-max_len // page_size)
    pages = block_tables[:, :num_pages].long()
    k = k_cache[pages].flatten(1, 2)[:, :max_len]  # [S, L, KVH, D]
    v = v_cache[pages].flatten(1, 2)[:, :max_len]
    valid = torch.arange(max_len)[None, :] < seq_lens.long()[:, None]  # [S, L]
    compute = torch.promote_types(q.dtype, torch.float32)
    qg = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim).to(compute)
    scores = torch.einsum("skgd,slkd->skgl", qg, k.to(compute)) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    v = torch.where(valid[:, :, None, None], v, torch.zeros((), dtype=v.dtype)).to(compute)
    out = torch.einsum("skgl,slkd->skgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)
