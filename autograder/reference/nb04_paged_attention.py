"""Notebook 04 paged_attention: reference solutions. GENERATED from solutions/04_paged_attention/04_paged_attention.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


import inspect
import math
import torch
from course_lib.attention.triton_decode import interpreting
import triton
import triton.language as tl


def paged_attention_loops(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Decode attention over a paged cache, one sequence, head and token at a time."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(num_seqs):
        table = block_tables[s].tolist()
        n = int(seq_lens[s])
        for h in range(num_heads):
            kv_head = h // group
            scores, values = [], []
            for t in range(n):
                page, row = table[t // page_size], t % page_size
                scores.append(float(q[s, h].double() @ k_cache[page, row, kv_head].double()) * scale)
                values.append(v_cache[page, row, kv_head].double())
            top = max(scores)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            acc = torch.zeros(head_dim, dtype=torch.float64)
            for w, value in zip(weights, values):
                acc += (w / total) * value
            out[s, h] = acc.to(q.dtype)
    return out


def paged_attention_vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Decode attention over a paged cache: one gather, one masked softmax, no loop over tokens."""
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    L = int(seq_lens.max())
    pages = block_tables[:, : -(-L // page_size)].long()  # [S, P]
    k = k_cache[pages].flatten(1, 2)[:, :L]  # [S, L, KVH, D]: every sequence's keys, in order
    v = v_cache[pages].flatten(1, 2)[:, :L]
    visible = torch.arange(L, device=q.device)[None, :] < seq_lens.to(q.device).long()[:, None]  # [S, L]
    compute = torch.promote_types(q.dtype, torch.float32)
    qg = q.view(num_seqs, num_kv_heads, group, head_dim).to(compute)
    scores = torch.einsum("skgd,slkd->skgl", qg, k.to(compute)) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    v = torch.where(visible[:, :, None, None], v, torch.zeros((), dtype=v.dtype, device=v.device))
    out = torch.einsum("skgl,slkd->skgd", weights, v.to(compute))
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


@triton.jit
def paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
    scale,  # the softmax scale (a float argument: use it, do not recompute it)
    stride_qs, stride_qh,  # q and out: [num_seqs, num_heads, head_dim], head_dim contiguous
    stride_page, stride_row, stride_kvh,  # k_cache and v_cache (one layout), head_dim contiguous
    stride_bts,  # block_tables: one row per sequence, page ids contiguous
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two (tile shapes must be powers of two)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # head_dim rounded up to a power of two >= 16
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # token positions handled per iteration
):
    """One program per (sequence, KV head): the GROUP query heads sharing that KV head, as a
    [GROUP_PAD, HEAD_DIM_PAD] tile, attend to the sequence's seq_len cached tokens."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)  # query head within the group
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows  # the query heads of this program
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :], mask=q_mask,
                other=0.0).to(tl.float32)  # [GROUP_PAD, HEAD_DIM_PAD], zero in the padding
    seq_len = tl.load(seq_lens_ptr + seq)
    block_table = block_tables_ptr + seq * stride_bts  # this sequence's row of page ids
    kv_base = kv_head * stride_kvh + dims  # where this KV head's vector sits inside one slot

    # The online softmax's running state, one entry per query head of the tile (float32):
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # the largest score seen so far
    l = tl.zeros([GROUP_PAD], tl.float32)  # sum of exp(score - m) over the tokens seen so far
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)  # sum of exp(score - m) * value

    for block_start in range(0, seq_len, BLOCK_N):
        tokens = block_start + tl.arange(0, BLOCK_N)
        tok_ok = tokens < seq_len
        # The block-table walk: each token's physical page (masked: past the sequence, the
        # table's entries must not be used), then its slot in the pool.
        pages = tl.load(block_table + tokens // PAGE_SIZE, mask=tok_ok, other=0)
        slots = pages.to(tl.int64) * stride_page + (tokens % PAGE_SIZE) * stride_row
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        offsets = slots[:, None] + kv_base[None, :]  # [BLOCK_N, HEAD_DIM_PAD]
        # Masked loads: garbage (NaN, inf) in slots the sequence does not own never enters.
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_N]
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
        # Online softmax: the first token of every block is inside the sequence, so m_new is finite.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old maximum (0 at first)
        p = tl.exp(scores - m_new[:, None])  # exactly 0 where the score is -inf
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)
def require_finished(kernel) -> None:
    """Stop with NotImplementedError while the kernel still holds its placeholder (a GPU could not
    compile it, and the interpreter would only report it deep inside)."""
    source = inspect.getsource(getattr(kernel, "fn", kernel))
    if "raise NotImplementedError" in source:
        raise NotImplementedError("paged_decode_kernel is not finished yet: write its loop above")
def paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """The launch (given): checks, tile sizes, the grid, one program per (sequence, KV head)."""
    require_finished(paged_decode_kernel)
    num_seqs, num_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    if int(seq_lens.max()) > block_tables.shape[1] * page_size:  # the kernel would read past the table
        raise ValueError(f"seq_lens up to {int(seq_lens.max())} need more than the {block_tables.shape[1]} "
                         f"pages of {page_size} tokens a block_tables row holds")
    q, k_cache, v_cache, block_tables = (t.contiguous() for t in (q, k_cache, v_cache, block_tables))
    seq_lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    paged_decode_kernel[(num_seqs, num_kv_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, out, float(scale),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        PAGE_SIZE=page_size, BLOCK_N=16 if interpreting() else 64,  # the interpreter: small tiles are faster
    )
    return out
