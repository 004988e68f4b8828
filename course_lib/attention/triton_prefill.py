"""Paged attention for prefill and chunked prefill (and decodes mixed in), as a Triton kernel.

Sequence `s` brings `n_s` new query tokens (rows `query_start_loc[s]:query_start_loc[s+1]` of
`q`); they are the *last* `n_s` of its `seq_lens[s]` cached tokens. Query `j` therefore sits at
absolute position `seq_lens[s] - n_s + j` and sees keys `0 ..` that position (causal, offset by
what was cached before this chunk). A decode is a chunk of one, so one launch serves a batch
that mixes prompts, chunks of prompts and decodes (what a continuous-batching scheduler emits).

Compared with the decode kernel (read that one first) two things change:

* **Rows are (query token, query head) pairs.** A program owns `BLOCK_Q` consecutive query
  tokens of one sequence and the `GROUP` query heads that share one KV head, packed into a
  `[BLOCK_M = BLOCK_Q * GROUP_PAD, HEAD_DIM]` tile (row `r` is token `r // GROUP_PAD`, head
  `r % GROUP_PAD`). Every K/V block loaded from the pages is reused by all of those rows: the
  larger the tile, the fewer times the context is read. For a decode the tile holds one token's
  group, exactly like the decode kernel.
* **The causal mask is per row.** Row `r` at absolute position `pos_r` keeps key `t` only if
  `t <= pos_r`. The loop stops at the last key any row of the tile can see, so a tile of early
  queries never reads the keys that only later queries need.

Prefill is compute-bound (every key is used by many queries), so here `tl.dot` on tensor cores
is what matters; the per-token page-table gather is the same as in decode.
"""
from __future__ import annotations

import torch

# Imported first: without CUDA it switches Triton to its interpreter before our @triton.jit runs.
from .triton_decode import LOG2E, _pow2_at_least, check_inputs  # isort: skip

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, out_ptr,
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh, stride_qd,
    stride_page, stride_row, stride_kvh, stride_d,  # k_cache and v_cache (same layout)
    stride_bts, stride_btp,
    stride_ot, stride_oh, stride_od,
    max_pages,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # GROUP padded to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per program; BLOCK_Q * GROUP_PAD rows in the tile
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    # The grid is sized for the longest chunk in the batch; shorter ones (decodes) leave
    # their extra query blocks with nothing to do.
    if q_block * BLOCK_Q >= num_queries:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    cached_before = seq_len - num_queries  # tokens that were in the cache before this chunk

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    query = q_block * BLOCK_Q + rows // GROUP_PAD  # index within this sequence's chunk
    head_in_group = rows % GROUP_PAD
    heads = kv_head * GROUP + head_in_group
    row_ok = (query < num_queries) & (head_in_group < GROUP)
    position = cached_before + query  # absolute position of each row's query token
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM

    q_offsets = (q_start + query)[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)

    # The last query of this tile sees keys up to its own position; nothing beyond is read
    # (and never past the columns of the block table, whatever seq_lens says).
    last_query = tl.minimum(q_block * BLOCK_Q + BLOCK_Q, num_queries) - 1
    kv_end = tl.minimum(tl.minimum(cached_before + last_query + 1, seq_len), max_pages * PAGE_SIZE)
    block_table = block_tables_ptr + seq * stride_bts
    head_and_dims = kv_head * stride_kvh + dims * stride_d
    for block_start in range(0, kv_end, BLOCK_N):
        tokens = block_start + tl.arange(0, BLOCK_N)
        tok_ok = tokens < kv_end
        pages = tl.load(block_table + (tokens // PAGE_SIZE) * stride_btp, mask=tok_ok, other=0)
        slots = pages.to(tl.int64) * stride_page + (tokens % PAGE_SIZE) * stride_row
        kv_offsets = slots[:, None] + head_and_dims[None, :]
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)

        if FP32_DOT:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        # Causal with offset: row r sees key t iff t <= position[r] (and t is a real token).
        visible = tok_ok[None, :] & (tokens[None, :] <= position[:, None])
        scores = tl.where(visible, scores * qk_scale, float("-inf"))

        # Key 0 is visible to every row and is in the first block, so after the first block m is
        # finite for every row and exp2(m - m_new) never computes -inf - -inf; a later block that is
        # entirely in a row's future leaves that row's m unchanged and adds exactly 0.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)

        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_offsets = (q_start + query)[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :] * stride_od
    tl.store(out_ptr + o_offsets, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def _launch_config(device, dtype, group_pad: int, head_dim_pad: int) -> tuple[int, int, int, int]:
    """(BLOCK_M rows of (token, head), BLOCK_N keys, num_warps, num_stages).

    GPU values were checked by compiling for sm_90 (no register spills): 64x64 tiles for 16-bit
    inputs with head_dim <= 128, half the keys for bigger heads, and 32x32 with 8 warps for fp32
    (fp32 dots do not use the 16-bit tensor-core path and need more registers). The interpreter
    pays per operation, not per element: mid-sized tiles mean fewer programs and iterations.
    """
    if torch.device(device).type == "cpu":
        return max(32, group_pad), 32, 4, 1
    if dtype == torch.float32:
        return max(32, group_pad), 32, 8, 2
    return max(64, group_pad), (64 if head_dim_pad <= 128 else 32), 4, 2


def paged_prefill_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                         max_query_len=None):
    """q: [num_tokens, num_heads, head_dim]; sequence s owns rows query_start_loc[s]:query_start_loc[s+1]
    (int32 [num_seqs + 1]), the last n_s of its seq_lens[s] cached tokens. Returns
    [num_tokens, num_heads, head_dim] in q's dtype.

    max_query_len: an upper bound on n_s, to size the grid without reading query_start_loc back
    to the host (a GPU sync).
    """
    check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    if query_start_loc.device != q.device or query_start_loc.dtype.is_floating_point:
        raise ValueError("query_start_loc must be an integer tensor on the same device as q")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"expected query_start_loc [{num_seqs + 1}] and block_tables [{num_seqs}, max_pages], "
                         f"got {tuple(query_start_loc.shape)} and {tuple(block_tables.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0 or num_tokens == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())  # one host sync
    if max_query_len < 1:
        return out

    group = num_heads // num_kv_heads
    group_pad = _pow2_at_least(group)
    head_dim_pad = _pow2_at_least(head_dim, 16)
    block_m, block_n, num_warps, num_stages = _launch_config(q.device, q.dtype, group_pad, head_dim_pad)
    block_q = block_m // group_pad
    grid = (num_seqs, triton.cdiv(int(max_query_len), block_q), num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        float(scale) * LOG2E,
        *q.stride(), *k_cache.stride(), *block_tables.stride(), *out.stride(),
        block_tables.shape[1],
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        PAGE_SIZE=page_size, BLOCK_N=block_n, FP32_DOT=q.dtype == torch.float32,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


__all__ = ["paged_prefill_triton"]
