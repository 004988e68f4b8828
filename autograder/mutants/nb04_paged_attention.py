"""Realistic wrong answers for notebook 04 (paged attention). Self-contained: no autograder imports."""
import math

import torch

# Imported before triton: without a GPU it switches Triton to its CPU interpreter first.
from course_lib.attention.triton_decode import interpreting
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, *, use_scale=True, kv_head=None, extra=0,
           logical=False, own_scale=False, max_trick=True):
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
                if own_scale:
                    score *= q.shape[-1] ** -0.5
                elif use_scale:
                    score *= scale
                scores.append(score)
                values.append(v_cache[page, row, kvh].double())
            top = max(scores) if max_trick else 0.0
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
                inclusive=False, logical=False, own_scale=False, mask_values=True, max_trick=True):
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
    if own_scale:
        scale = head_dim ** -0.5
    scores = torch.einsum("shd,slhd->shl", q.double(), k) * (scale if use_scale else 1.0)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    if max_trick:
        probs = torch.softmax(scores, dim=-1)
    else:
        weights = torch.exp(scores)
        probs = weights / weights.sum(dim=-1, keepdim=True)
    if mask_values:
        v = torch.where(valid[:, :, None, None], v, torch.zeros((), dtype=v.dtype))
    return torch.einsum("shl,slhd->shd", probs, v).to(q.dtype)


def loops_recomputes_scale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Ignores the scale argument and uses head_dim ** -0.5."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, own_scale=True)


def loops_no_max_trick(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """exp(score) without subtracting the largest score: overflows on large scores."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale, max_trick=False)


def vectorized_is_loops(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Correct values, but still a Python loop over every token."""
    return _loops(q, k_cache, v_cache, block_tables, seq_lens, scale)


def vectorized_in_bfloat16(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Computes in q's dtype (no promotion): bfloat16 scores, weights and sums."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    length = int(seq_lens.max())
    pages = block_tables[:, : -(-length // page_size)].long()
    k = k_cache[pages].flatten(1, 2)[:, :length]
    v = v_cache[pages].flatten(1, 2)[:, :length]
    visible = torch.arange(length)[None, :] < seq_lens.long()[:, None]
    qg = q.view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", qg, k) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    v = torch.where(visible[:, :, None, None], v, torch.zeros((), dtype=v.dtype))
    return torch.einsum("skgl,slkd->skgd", weights, v).reshape(num_seqs, num_heads, head_dim)


def vectorized_loops_over_pages(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Gathers the keys and values page by page in a comprehension (one Python iteration per page), then
    computes like the vectorised version."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    length = int(seq_lens.max())
    columns = range(-(-length // page_size))
    k = torch.cat([k_cache[block_tables[:, j].long()] for j in columns], dim=1)[:, :length].double()
    v = torch.cat([v_cache[block_tables[:, j].long()] for j in columns], dim=1)[:, :length].double()
    visible = torch.arange(length)[None, :] < seq_lens.long()[:, None]
    qg = q.double().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", qg, k) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    v = torch.where(visible[:, :, None, None], v, torch.zeros((), dtype=v.dtype))
    return torch.einsum("skgl,slkd->skgd", weights, v).reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def loops_in_bfloat16(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Loops that keep the running sums in q's dtype: a bfloat16 accumulator."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(num_seqs):
        pages = block_tables[s].tolist()
        for h in range(num_heads):
            rows = [(pages[t // page_size], t % page_size) for t in range(int(seq_lens[s]))]
            scores = [float((q[s, h] * k_cache[p, r, h // group]).sum()) * scale for p, r in rows]
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            acc = torch.zeros(head_dim, dtype=q.dtype)
            for w, (p, r) in zip(weights, rows):
                acc += w / sum(weights) * v_cache[p, r, h // group]
            out[s, h] = acc
    return out


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


def vectorized_masks_scores_not_values(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Masks the scores with -inf but multiplies the garbage values by their zero weights (0 * nan = nan)."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, mask_values=False)


def vectorized_recomputes_scale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Ignores the scale argument and uses head_dim ** -0.5."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, own_scale=True)


def vectorized_no_max_trick(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """A hand-written softmax, exp(scores) / sum, without subtracting the maximum: inf / inf on large scores."""
    return _vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale, max_trick=False)


# --------------------------------------------------------------------------------------------- Triton
@triton.jit
def _kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, scale,
    stride_qs, stride_qh, stride_page, stride_row, stride_kvh, stride_bts,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_VALUES: tl.constexpr, RESCALE: tl.constexpr, SUBTRACT_MAX: tl.constexpr, USE_TABLE: tl.constexpr,
    INCLUSIVE: tl.constexpr, OWN_SCALE: tl.constexpr, MASK_TABLE: tl.constexpr, LOW_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :], mask=q_mask,
                other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + seq)
    block_table = block_tables_ptr + seq * stride_bts
    kv_base = kv_head * stride_kvh + dims
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    if OWN_SCALE:
        scale = 1.0 / tl.sqrt(HEAD_DIM * 1.0)
    for block_start in range(0, seq_len, BLOCK_N):
        tokens = block_start + tl.arange(0, BLOCK_N)
        if INCLUSIVE:
            tok_ok = tokens <= seq_len
        else:
            tok_ok = tokens < seq_len
        if USE_TABLE and MASK_VALUES and MASK_TABLE:
            pages = tl.load(block_table + tokens // PAGE_SIZE, mask=tok_ok, other=0)
        elif USE_TABLE:  # no mask on the page-number load: the table's padding entries are followed too
            pages = tl.load(block_table + tokens // PAGE_SIZE)
        else:
            pages = tokens // PAGE_SIZE
        slots = pages.to(tl.int64) * stride_page + (tokens % PAGE_SIZE) * stride_row
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        offsets = slots[:, None] + kv_base[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        if MASK_VALUES:
            v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        else:
            v = tl.load(v_cache_ptr + offsets, mask=dim_ok[None, :], other=0.0).to(tl.float32)
        if LOW_PRECISION:  # back to the cache's dtype: the block's products and sums in bfloat16
            qk = q.to(k_cache_ptr.dtype.element_ty)
            k = k.to(k_cache_ptr.dtype.element_ty)
            v = v.to(v_cache_ptr.dtype.element_ty)
        else:
            qk = q
        scores = tl.sum(qk[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
        if SUBTRACT_MAX:
            m_new = tl.maximum(m, tl.max(scores, axis=1))
        else:
            m_new = tl.zeros([GROUP_PAD], tl.float32)
        alpha = tl.exp(m - m_new)
        if not SUBTRACT_MAX:
            alpha = tl.full([GROUP_PAD], 1.0, tl.float32)
        p = tl.exp(scores - m_new[:, None])
        if RESCALE:
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p.to(v.dtype)[:, :, None] * v[None, :, :], axis=1)
        else:
            l = l + tl.sum(p, axis=1)
            acc = acc + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, **flags):
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    q, k_cache, v_cache, block_tables = (t.contiguous() for t in (q, k_cache, v_cache, block_tables))
    out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    options = dict(MASK_VALUES=True, RESCALE=True, SUBTRACT_MAX=True, USE_TABLE=True, INCLUSIVE=False,
                   OWN_SCALE=False, MASK_TABLE=True, LOW_PRECISION=False)
    options.update(flags)
    _kernel[(num_seqs, num_kv_heads)](
        q, k_cache, v_cache, block_tables, seq_lens.to(torch.int32).contiguous(), out, float(scale),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)), PAGE_SIZE=page_size,
        BLOCK_N=16 if interpreting() else 64, **options)
    return out


def triton_masks_scores_not_values(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Sets the scores of unowned slots to -inf but loads pages and values unmasked: 0 * nan = nan."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, MASK_VALUES=False)


def triton_unmasked_table_load(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Masks K, V and the scores, but loads the page numbers of a whole block unmasked: past seq_len it reads
    table entries of no token (past the last row: memory it does not own)."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, MASK_TABLE=False)


def triton_no_rescale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Online softmax that forgets to rescale l and acc by exp(m_old - m_new) when the maximum grows."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, RESCALE=False)


def triton_no_max(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """exp(score) with no running maximum: overflows to inf / inf on large scores."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, SUBTRACT_MAX=False)


def triton_logical_pages(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Skips the block-table walk: token t read from page t // PAGE_SIZE."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, USE_TABLE=False)


def triton_mask_off_by_one(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Masks with tokens <= seq_len: one garbage slot is attended."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, INCLUSIVE=True)


def triton_recomputes_scale(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Ignores the scale argument and uses 1 / sqrt(HEAD_DIM)."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, OWN_SCALE=True)


def triton_in_bfloat16(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Keeps q, K and V in the cache's dtype for the block's arithmetic: with bfloat16 inputs the scores, the
    weighted values and their sums over a block are computed and rounded in bfloat16 (float32 inputs: right)."""
    return _triton(q, k_cache, v_cache, block_tables, seq_lens, scale, LOW_PRECISION=True)


def triton_torch_wrapper(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Right numbers, but no kernel: the wrapper computes the attention with torch."""
    return _vectorized(q.double(), k_cache.double(), v_cache.double(), block_tables, seq_lens, scale).to(q.dtype)


MUTANTS = {
    "paged_attention_loops": [loops_no_scale, loops_in_bfloat16, loops_wrong_kv_head, loops_misses_own_token, loops_one_token_too_many,
                              loops_logical_pages, loops_recomputes_scale, loops_no_max_trick],
    "paged_attention_vectorized": [vectorized_is_loops, vectorized_no_scale, vectorized_repeat_not_interleave,
                                   vectorized_mask_off_by_one, vectorized_logical_pages,
                                   vectorized_masks_scores_not_values, vectorized_recomputes_scale,
                                   vectorized_no_max_trick, vectorized_in_bfloat16, vectorized_loops_over_pages],
    "paged_attention_triton": [triton_masks_scores_not_values, triton_unmasked_table_load, triton_no_rescale, triton_no_max,
                               triton_logical_pages, triton_mask_off_by_one, triton_recomputes_scale,
                               triton_torch_wrapper, triton_in_bfloat16],
}
