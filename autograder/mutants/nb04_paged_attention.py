"""Realistic wrong answers for notebook 04 (paged attention). Self-contained: no autograder imports."""
import math

import torch


def _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, *, use_scale=True, kv_head=None, extra=0,
           logical=False):
    num_seqs, num_heads, _ = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(num_seqs):
        pages = block_tables[s].tolist()
        length = int(seq_lens[s]) + extra
        for h in range(num_heads):
            kvh = kv_head(h, group, num_kv_heads) if kv_head else h // group
            scores, values = [], []
            for t in range(max(1, length)):
                page = t // page_size if logical else pages[t // page_size]
                row = t % page_size
                score = float((q[s, h].double() * k_cache[page, row, kvh].double()).sum())
                scores.append(score * scale if use_scale else score)
                values.append(v_cache[page, row, kvh].double())
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            acc = torch.zeros_like(values[0])
            for w, value in zip(weights, values):
                acc += (w / total) * value
            out[s, h] = acc.to(q.dtype)
    return out


def loops_no_scale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Forgets the softmax scale."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, use_scale=False)


def loops_wrong_kv_head(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """No GQA grouping: query head h reads KV head h % num_kv_heads."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, kv_head=lambda h, g, kvh: h % kvh)


def loops_misses_own_token(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Wrong causal offset: attends to tokens 0 .. seq_len - 2 (not its own)."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, extra=-1)


def loops_one_token_too_many(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Wrong causal offset: reads one slot past the sequence."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, extra=1)


def loops_logical_pages(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Ignores the block table: token t read from page t // page_size."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, logical=True)


def _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, *, use_scale=True, repeat=False,
                inclusive=False, logical=False):
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max()) + (1 if inclusive else 0)
    num_pages = -(-max_len // page_size)
    if logical:
        pages = torch.arange(num_pages)[None].expand(num_seqs, num_pages)
    else:
        pages = block_tables[:, :num_pages].long()
    k = k_cache[pages].flatten(1, 2)[:, :max_len].double()
    v = v_cache[pages].flatten(1, 2)[:, :max_len].double()
    positions = torch.arange(max_len)[None, :]
    valid = positions <= seq_lens.long()[:, None] if inclusive else positions < seq_lens.long()[:, None]
    group = num_heads // num_kv_heads
    if repeat:
        k = k.repeat(1, 1, group, 1)  # tiles the KV heads: head h gets KV head h % num_kv_heads
        v = v.repeat(1, 1, group, 1)
    else:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("shd,slhd->shl", q.double(), k) * (scale if use_scale else 1.0)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    v = torch.where(valid[:, :, None, None], v, torch.zeros((), dtype=v.dtype))
    return torch.einsum("shl,slhd->shd", probs, v).to(q.dtype)


def vectorized_is_loops(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Correct values, but still a Python loop over every token."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale)


def vectorized_no_scale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Forgets the softmax scale."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, use_scale=False)


def vectorized_repeat_not_interleave(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Expands KV heads with repeat (tiling) instead of repeat_interleave: wrong KV head per query head."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, repeat=True)


def vectorized_mask_off_by_one(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Masks with <= seq_lens: one garbage slot is attended."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, inclusive=True)


def vectorized_logical_pages(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Gathers pages 0, 1, 2, ... instead of the sequence's block table."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, logical=True)


MUTANTS = {
    "paged_attention_loops": [loops_no_scale, loops_wrong_kv_head, loops_misses_own_token, loops_one_token_too_many,
                              loops_logical_pages],
    "paged_attention_vectorized": [vectorized_is_loops, vectorized_no_scale, vectorized_repeat_not_interleave,
                                   vectorized_mask_off_by_one, vectorized_logical_pages],
}
