"""The "cpu" backend: paged decode attention as a small C kernel (cpu_decode.c).

Why a C kernel on the CPU: a decode step gives each sequence one query, so attention is many
tiny products ([group, head_dim] x [head_dim, len] per sequence and KV head). The torch backend
first gathers every sequence's keys and values into a dense copy, then runs batched matmuls;
at these sizes the copy and each small matmul's fixed cost dominate (bench attention measures
it). The kernel reads each key and value once, in place, through the block table.

The source is compiled on first use with the system C compiler and cached (`course_lib.native`
says how and where). No compiler: `available()` says False and why, the "auto" backend uses
torch instead, and asking for "cpu" explicitly raises an error that says so.

Decode only, float32 and float64; prefill under this backend uses the torch implementation.
Large calls split their sequences over `torch.get_num_threads()` threads.
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..native import Kernel

SOURCE = Path(__file__).with_name("cpu_decode.c")


def _declare(lib: ctypes.CDLL, c_scalar) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.paged_decode.restype = None
    lib.paged_decode.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                                 c_scalar]


KERNEL = Kernel(SOURCE, "the cpu attention backend", _declare)


def load_kernel(dtype: torch.dtype) -> ctypes.CDLL:
    """The compiled kernel for `dtype` (built on first use); ValueError for an unsupported dtype,
    RuntimeError (saying why) when it cannot be built."""
    return KERNEL.load(dtype)


def available() -> tuple[bool, str]:
    """(True, "") when the kernel is built (or builds now) for float32; else (False, the reason)."""
    return KERNEL.available()


@dataclass
class CpuDecodePlan:
    """What every layer of one decode step shares: validated, contiguous tables and lengths."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_len: int


def plan_decode_cpu(k_cache, block_tables, seq_lens) -> CpuDecodePlan:
    """Check the step's tables and lengths once, for all layers (the engine calls this once a step)."""
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError(f"block_tables and seq_lens must be int32, got {block_tables.dtype} and {seq_lens.dtype}")
    num_pages, page_size = k_cache.shape[:2]
    capacity = block_tables.shape[1] * page_size
    lo, hi = (int(seq_lens.min()), int(seq_lens.max())) if seq_lens.numel() else (1, 1)
    if lo < 1 or hi > capacity:
        raise ValueError(f"seq_lens must be in 1..{capacity} (table width x page size), got {lo}..{hi}")
    # The kernel trusts every page id a sequence reads: check them here, once a step, because C
    # would read out of bounds where torch's index_select raises.
    read = torch.arange(block_tables.shape[1])[None, :] < (seq_lens[:, None] + page_size - 1) // page_size
    if bool((read & ((block_tables < 0) | (block_tables >= num_pages))).any()):
        raise ValueError(f"block_tables holds page ids outside 0..{num_pages - 1} where a sequence reads")
    return CpuDecodePlan(block_tables.contiguous(), seq_lens.contiguous(), hi)


def paged_decode_cpu(q, k_cache, v_cache, block_tables, seq_lens, scale, plan: CpuDecodePlan | None = None):
    """q: [num_seqs, num_heads, head_dim] (rows may be strided); caches [num_pages, page_size,
    num_kv_heads, head_dim]; block_tables int32 [num_seqs, max_pages]; seq_lens int32 [num_seqs]
    -> [num_seqs, num_heads, head_dim]. Same contract as `paged_decode`; `plan` (from
    `plan_decode_cpu`) skips re-checking the tables in every layer."""
    S, H, D = q.shape
    num_pages, page_size, kvh, head_dim = k_cache.shape
    lib = load_kernel(q.dtype)
    if q.device.type != "cpu" or k_cache.device.type != "cpu":
        raise ValueError(f"the cpu attention backend needs CPU tensors, got q on {q.device}, cache on {k_cache.device}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype or v_cache.shape != k_cache.shape:
        raise ValueError(f"q, k_cache and v_cache must share one dtype and the caches one shape, got "
                         f"{q.dtype}/{k_cache.dtype}/{v_cache.dtype}, {tuple(k_cache.shape)}/{tuple(v_cache.shape)}")
    if head_dim != D or H % kvh:
        raise ValueError(f"q [{S}, {H}, {D}] does not fit caches with {kvh} KV heads of dim {head_dim}")
    plan = plan if plan is not None else plan_decode_cpu(k_cache, block_tables, seq_lens)
    if q.stride(2) != 1:
        q = q.contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    out = torch.empty(S, H, D, dtype=q.dtype)
    if S == 0:
        return out
    workers = _workers(S, plan.max_len, H, D)
    scores = torch.empty(workers, H * plan.max_len, dtype=q.dtype)  # scratch per thread: one sequence's
    slots = torch.empty(workers, plan.max_len, dtype=torch.int64)  # scores and slot numbers
    bt, lens = plan.block_tables, plan.seq_lens

    def piece(i, first, last):
        """The kernel's arguments for sequences first..last-1, with scratch row i."""
        return (q.data_ptr() + first * q.stride(0) * q.element_size(), q.stride(0), q.stride(1),
                k_cache.data_ptr(), v_cache.data_ptr(), bt.data_ptr() + first * bt.stride(0) * bt.element_size(),
                bt.stride(0), lens.data_ptr() + first * lens.element_size(), out[first].data_ptr(),
                scores[i].data_ptr(), slots[i].data_ptr(), last - first, H, kvh, D, page_size, scale)

    if workers == 1:
        lib.paged_decode(*piece(0, 0, S))
        return out
    # Sequences are independent: split them over threads. ctypes lets go of the GIL during the
    # call, so the threads really run at once.
    bounds = [S * i // workers for i in range(workers + 1)]
    jobs = [_pool().submit(lib.paged_decode, *piece(i, first, last))
            for i, (first, last) in enumerate(zip(bounds, bounds[1:]))]
    for job in jobs:
        job.result()
    return out


# Below this much work per thread (sequences x context x heads x head_dim multiply-adds), one
# thread does it all: handing a piece to another thread costs tens of microseconds.
PARALLEL_MIN_WORK = 2**20
_executor: ThreadPoolExecutor | None = None


def _workers(num_seqs: int, max_len: int, num_heads: int, head_dim: int) -> int:
    """Threads for one call: torch's thread count, fewer when the work is small."""
    work = num_seqs * max_len * num_heads * head_dim
    return max(1, min(torch.get_num_threads(), num_seqs, work // PARALLEL_MIN_WORK))


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="paged_decode")
    return _executor
