"""Paged attention for the decode step, as a Triton kernel (the course's "PagedAttention on the GPU").

One new query token per sequence attends to every token the sequence has cached. The keys and
values are not contiguous: token `t` of sequence `s` lives in physical page
`block_tables[s, t // page_size]`, row `t % page_size` of `k_cache` / `v_cache`
(`[num_pages, page_size, num_kv_heads, head_dim]`). The kernel follows the block table itself,
so no gathered copy of the context is ever made.

Why the kernel looks the way it does:

* **Decode is memory-bound.** Each cached key and value is read once and used for one dot
  product per query head, so the runtime is "bytes of K and V / memory bandwidth". Everything
  below is about reading K/V exactly once, in wide contiguous rows, from as many SMs at a time
  as possible.
* **One program per (sequence, KV head), not per query head.** With grouped-query attention
  (GQA) the `group = num_heads // num_kv_heads` query heads that share a KV head are handled by
  the same program as a `[GROUP, HEAD_DIM]` tile, so each K/V row is loaded once for the whole
  group (a per-query-head kernel would read the same bytes `group` times). The tile is padded to
  16 rows because `tl.dot` (tensor cores) needs at least 16 rows; the padding rows cost
  arithmetic, which decode has plenty of to spare, and no memory traffic (their loads are masked).
* **Tokens are gathered one row at a time through the block table.** A block of `BLOCK_N`
  token positions looks up `BLOCK_N` page numbers (cheap: the block table is tiny and cached)
  and then loads `BLOCK_N` rows of `head_dim` contiguous elements. This works for any page size
  (1 to 128, power of two or not) with the same code; `PAGE_SIZE` is a compile-time constant so
  `t // PAGE_SIZE` becomes a shift when it is a power of two.
* **Online softmax in fp32** (Milakov & Gimelshein 2018, FlashAttention): keep a running max
  `m`, a running denominator `l` and an unnormalised accumulator `acc`; when a new block raises
  the max, rescale the old `l` and `acc` by `exp(m_old - m_new)`. One pass over K/V, no score
  buffer of length `seq_len`. We work in base 2 (`exp2`, with `log2(e)` folded into the scale):
  `exp2` is the native instruction, `exp` is `exp2` plus a multiply.
* **Split-KV ("flash-decoding").** With a small batch there are only `num_seqs * num_kv_heads`
  programs, far fewer than the GPU has SMs (132 on an H100/H200), so most of the chip would sit
  idle while a few programs walk long contexts. Splitting each context into `num_splits` ranges
  gives `num_splits` times more programs; each writes a partial result (its normalised output
  and its log-sum-exp), and a second, tiny kernel combines them exactly:
  `out = sum_j exp2(lse_j - LSE) * o_j` with `LSE = log2(sum_j exp2(lse_j))`.
  Every split covers the same whole number of blocks, so in a batch of mixed lengths a short
  sequence's later splits start past its end: they return at once and write nothing, and the
  reduce reads only the splits that cover tokens. With one split the first kernel normalises and
  writes the output itself (no second launch). `choose_num_splits` picks the count.
* **Garbage never reaches the result.** Slots past `seq_len` (the rest of the last page, and
  pages a sequence does not own) may hold anything, NaN included. Every K/V load is masked
  (`other=0`), and every score outside the sequence is set to `-inf` before the softmax, so
  such slots contribute exactly zero (not `0 * NaN`).

On a machine without a GPU the same kernels run in Triton's interpreter (`TRITON_INTERPRET=1`,
CPU tensors), which is slow but exact: that is how the tests run in CI.
"""
from __future__ import annotations

import os

import torch

# Triton decides at decoration time (`@triton.jit`) whether a kernel is compiled for the GPU or
# run by the interpreter. Without CUDA the interpreter is the only way the kernel can run, so
# turn it on before the decorators below execute (an explicit TRITON_INTERPRET=0 is respected).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,  # softmax scale * log2(e): scores come out in base-2 units, ready for exp2
    tokens_per_split,  # a multiple of BLOCK_N, the same for every sequence in the batch
    stride_qs, stride_qh, stride_qd,
    stride_page, stride_row, stride_kvh, stride_d,  # k_cache and v_cache (same layout)
    stride_bts, stride_btp,
    stride_os, stride_oh, stride_od,
    stride_ps, stride_ph, stride_pk, stride_pd,  # partial outputs [seqs, heads, splits, head_dim]
    stride_ls, stride_lh, stride_lk,  # partial log-sum-exp [seqs, heads, splits]
    max_pages,  # columns of block_tables: never read past them
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot needs 16 rows)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # next power of two >= max(HEAD_DIM, 16)
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # tokens per inner iteration
    SINGLE_SPLIT: tl.constexpr,  # one split: normalise and write `out` directly
    FP32_DOT: tl.constexpr,  # fp32 inputs: ask for true fp32 dots (not TF32) so fp32 stays exact
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    if not SINGLE_SPLIT:
        if start >= seq_len:
            return  # this split lies past the end of a short sequence; the reduce never reads it
    # Never walk past the columns of the block table, whatever seq_lens says.
    end = tl.minimum(tl.minimum(start + tokens_per_split, seq_len), max_pages * PAGE_SIZE)

    rows = tl.arange(0, GROUP_PAD)  # query head within the group
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows  # the query heads that share this KV head

    # The group's queries: a [GROUP_PAD, HEAD_DIM_PAD] tile, zero in the padding.
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    block_table = block_tables_ptr + seq * stride_bts
    head_and_dims = kv_head * stride_kvh + dims * stride_d  # where a row's vector sits in its slot

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max (base-2 scores)
    l = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)  # running sum of exp2(score - m) * v

    for block_start in range(start, end, BLOCK_N):
        tokens = block_start + tl.arange(0, BLOCK_N)
        tok_ok = tokens < end
        # Page-table walk: the physical page, and the row in it, of each token. Masked, so the
        # table entries past the sequence's last page (which may hold anything) are never used.
        pages = tl.load(block_table + (tokens // PAGE_SIZE) * stride_btp, mask=tok_ok, other=0)
        # int64: page * stride_page passes 2**31 elements in a pool of a few GiB.
        slots = pages.to(tl.int64) * stride_page + (tokens % PAGE_SIZE) * stride_row
        kv_offsets = slots[:, None] + head_and_dims[None, :]  # [BLOCK_N, HEAD_DIM_PAD]
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        # Masked loads give 0 for slots past seq_len, so NaN garbage there never enters a dot.
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)

        if FP32_DOT:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))  # fp16/bf16 on tensor cores, fp32 accumulate
        scores = tl.where(tok_ok[None, :], scores * qk_scale, float("-inf"))

        # Online softmax. The first token of every block we visit is inside the sequence
        # (block_start < end), so m_new is finite and exp2(m - m_new) never sees -inf - -inf.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)  # rescales what we had; exp2(-inf) = 0 on the first block
        p = tl.exp2(scores - m_new[:, None])  # exactly 0 for masked tokens
        l = l * alpha + tl.sum(p, axis=1)

        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            # Probabilities are in [0, 1]: casting them to the cache dtype for the tensor-core dot
            # is the standard FlashAttention trade (the accumulator stays fp32).
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    has_tokens = l > 0  # false only for an empty sequence (seq_len == 0): output 0, not 0/0
    o = acc / tl.where(has_tokens, l, 1.0)[:, None]
    store_mask = row_ok[:, None] & dim_ok[None, :]
    if SINGLE_SPLIT:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 o.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        # The partial result, normalised, and its log-sum-exp (base 2): all the reduce needs.
        lse = m + tl.log2(l)
        tl.store(part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph + split * stride_pk
                 + dims[None, :] * stride_pd, o, mask=store_mask)
        tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split * stride_lk, lse, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, seq_lens_ptr,
    num_splits, tokens_per_split,
    stride_os, stride_oh, stride_od,
    stride_ps, stride_ph, stride_pk, stride_pd,
    stride_ls, stride_lh, stride_lk,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # num_splits padded to a power of two
):
    """Combine the splits of one (sequence, query head): a softmax over the splits' log-sum-exps,
    out = sum_j exp2(lse_j - max lse) * o_j / sum_j exp2(lse_j - max lse)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    # Only the splits that start inside the sequence ran; the rest wrote nothing (their buffers
    # hold garbage) and must not be read.
    seq_len = tl.load(seq_lens_ptr + seq)
    split_ok = (splits < num_splits) & (splits * tokens_per_split < seq_len)

    lse = tl.load(part_lse_ptr + seq * stride_ls + head * stride_lh + splits * stride_lk,
                  mask=split_ok, other=float("-inf"))
    # With seq_len == 0 no split ran: use 0 as the reference so we never compute -inf - -inf.
    lse_max = tl.where(seq_len > 0, tl.max(lse, axis=0), 0.0)
    weights = tl.exp2(lse - lse_max)  # 0 for the splits that did not run
    total = tl.sum(weights, axis=0)

    o = tl.load(part_out_ptr + seq * stride_ps + head * stride_ph + splits[:, None] * stride_pk
                + dims[None, :] * stride_pd,
                mask=split_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    out = tl.sum(weights[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


# ---------------------------------------------------------------------------------------------
# Host side: checks, launch parameters, the split heuristic.
# ---------------------------------------------------------------------------------------------

def interpreting() -> bool:
    """True when this module's kernels were built for Triton's CPU interpreter (decided once, by
    TRITON_INTERPRET at import time; changing the variable later changes nothing)."""
    return not isinstance(_decode_split_kernel, triton.runtime.JITFunction)


def _check_triton_mode() -> None:
    """Triton's own helpers (`tl.zeros`, `tl.sum`, ...) are `@triton.jit` functions too, decorated
    when `triton` is first imported. If something imported Triton before TRITON_INTERPRET was set
    (building a `transformers` model does), they were built for the GPU while these kernels were
    built for the interpreter, and Triton fails deep inside with "Cannot call @triton.jit'd outside
    of the scope of a kernel". Say what happened and how to fix it instead."""
    # Only the interpreter side is checked: on a GPU a stdlib helper that is not a JITFunction (a
    # future Triton may make them builtins) must never stop a kernel that would run fine.
    if interpreting() and isinstance(tl.zeros, triton.runtime.JITFunction):
        raise RuntimeError(
            "Triton was imported before TRITON_INTERPRET was set (importing or building a transformers "
            "model imports it), so Triton's library and these kernels disagree about running in the "
            "interpreter. Set TRITON_INTERPRET=1 (no GPU) before anything imports triton, e.g. "
            "`import course_lib.attention.triton_decode` first, or use backend='torch'.")


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def check_inputs(q, k_cache, v_cache, block_tables, seq_lens) -> None:
    """Shared by decode and prefill: clear errors instead of a wrong answer or a crash in the kernel."""
    _check_triton_mode()
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"triton attention supports dtypes {SUPPORTED_DTYPES}, got q.dtype={q.dtype} "
                         "(use backend='torch' for float64)")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must both be [num_pages, page_size, num_kv_heads, head_dim], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache must share one memory layout, got strides {k_cache.stride()} "
                         f"and {v_cache.stride()}")
    num_heads, head_dim = q.shape[-2], q.shape[-1]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and of the cache ({k_cache.shape[3]}) differ")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if not 1 <= page_size <= 128:
        raise ValueError(f"page_size must be between 1 and 128, got {page_size}")
    if not 1 <= head_dim <= 256:
        raise ValueError(f"head_dim must be between 1 and 256, got {head_dim}")
    if block_tables.dtype.is_floating_point or seq_lens.dtype.is_floating_point:
        raise ValueError("block_tables and seq_lens must be integer tensors (int32)")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    device = q.device
    if device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing "
                         "course_lib.attention.triton_decode, or move the inputs to CUDA")
    if device.type != "cpu" and interpreting():
        raise ValueError("TRITON_INTERPRET=1 runs kernels on CPU tensors only; move the inputs to the CPU "
                         "or unset TRITON_INTERPRET before importing course_lib")


def num_sms(device) -> int:
    """Streaming multiprocessors on `device` (1 for the CPU interpreter: it runs programs one by one)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, sm_count: int,
                      block_n: int = 64, min_tokens_per_split: int = 256, max_splits: int = 64) -> int:
    """How many KV splits fill the GPU, without making splits too small to be worth it.

    `num_seqs * num_kv_heads` programs run with one split. If that already fills the SMs
    (at least one program each), splitting only adds the reduce's traffic: use 1. Otherwise aim
    for about two programs per SM (so one can load while the other computes), but keep every
    split at least `min_tokens_per_split` tokens long: a split shorter than that spends more on
    its fixed cost (loading Q, writing a partial result) than it saves.
    """
    programs = max(1, num_seqs * num_kv_heads)
    if programs >= sm_count or max_seq_len <= min_tokens_per_split:
        return 1
    wanted = triton.cdiv(2 * sm_count, programs)
    affordable = max(1, max_seq_len // min_tokens_per_split)
    return max(1, min(wanted, affordable, max_splits, triton.cdiv(max_seq_len, block_n)))


def _launch_config(device, dtype) -> tuple[int, int, int]:
    """(BLOCK_N tokens per iteration, num_warps, num_stages).

    GPU values come from compiling for sm_90 and reading the register use (no spills, <= ~100
    registers, so several programs share an SM): 64 tokens x 128 dims x 2 bytes = 16 KiB of K per
    iteration keeps plenty of loads in flight, and two stages let the next block's loads overlap
    this block's math. fp32 tiles are twice the bytes, so half the tokens and twice the warps.
    The interpreter runs each operation in Python at a fixed cost whatever the tile size, so
    there fewer, bigger blocks are faster; 32 tokens still gives several blocks per test sequence
    (the online-softmax rescale gets exercised).
    """
    if torch.device(device).type == "cpu":
        return 32, 4, 1
    if dtype == torch.float32:
        return 32, 8, 2
    return 64, 4, 2


def paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                        max_seq_len=None, block_n=None):
    """q: [num_seqs, num_heads, head_dim]; caches: [num_pages, page_size, num_kv_heads, head_dim];
    block_tables: int32 [num_seqs, max_pages]; seq_lens: int32 [num_seqs] (tokens cached, the new
    one included). Returns [num_seqs, num_heads, head_dim] in q's dtype.

    num_splits: KV splits per sequence (None: `choose_num_splits`). Any value >= 1 is exact;
    splits that cover no tokens of a short sequence contribute nothing.
    max_seq_len: an upper bound on seq_lens, to size the splits without reading seq_lens back to
    the host (a GPU sync). Only needed when splitting.
    block_n: tokens per kernel iteration (a power of two >= 16); the default suits the device.
    """
    check_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    if q.dim() != 3:
        raise ValueError(f"q must be [num_seqs, num_heads, head_dim], got shape {tuple(q.shape)}")
    num_seqs, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(f"block_tables must be [{num_seqs}, max_pages] and seq_lens [{num_seqs}], got "
                         f"{tuple(block_tables.shape)} and {tuple(seq_lens.shape)}")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out

    default_block_n, num_warps, num_stages = _launch_config(q.device, q.dtype)
    block_n = block_n or default_block_n
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if num_splits is None or num_splits > 1:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())  # one device-to-host sync
        max_seq_len = max(1, int(max_seq_len))
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms(q.device), block_n)
    num_splits = int(num_splits)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    group = num_heads // num_kv_heads
    head_dim_pad = _pow2_at_least(head_dim, 16)
    if num_splits == 1:
        tokens_per_split = block_tables.shape[1] * page_size  # everything the table can address
        part_out = part_lse = out  # unused placeholders (the SINGLE_SPLIT branch never touches them)
        part_strides = (0, 0, 0, 0)
        lse_strides = (0, 0, 0)
    else:
        # Same split length for every sequence, rounded to whole blocks so only the last block of
        # a sequence is ever partial. Short sequences simply have empty trailing splits.
        tokens_per_split = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_strides, lse_strides = part_out.stride(), part_lse.stride()

    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens,
        out, part_out, part_lse,
        float(scale) * LOG2E, tokens_per_split,
        *q.stride(), *k_cache.stride(), *block_tables.stride(), *out.stride(),
        *part_strides, *lse_strides,
        block_tables.shape[1],
        GROUP=group, GROUP_PAD=_pow2_at_least(group, 16),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        PAGE_SIZE=page_size, BLOCK_N=block_n,
        SINGLE_SPLIT=num_splits == 1, FP32_DOT=q.dtype == torch.float32,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out, part_out, part_lse, seq_lens, num_splits, tokens_per_split,
            *out.stride(), *part_out.stride(), *part_lse.stride(),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=_pow2_at_least(num_splits),
            num_warps=4,
        )
    return out


__all__ = ["paged_decode_triton", "choose_num_splits", "check_inputs", "interpreting", "num_sms"]
