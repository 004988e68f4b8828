"""The "cpu" backend: paged decode attention as a small C kernel (cpu_decode.c).

Why a C kernel on the CPU: a decode step gives each sequence one query, so attention is many
tiny products ([group, head_dim] x [head_dim, len] per sequence and KV head). The torch backend
first gathers every sequence's keys and values into a dense copy, then runs batched matmuls;
at these sizes the copy and each small matmul's fixed cost dominate (bench attention measures
it). The kernel reads each key and value once, in place, through the block table.

The source is compiled on first use with the system C compiler (`$CC`, else `cc`), in about a
second, and cached under `$COURSE_LIB_KERNEL_CACHE` (default `~/.cache/course_lib/kernels`),
keyed by the source, the flags and the CPU. No compiler: `available()` says False and why, the "auto"
backend uses torch instead, and asking for "cpu" explicitly raises an error that says so.

Decode only, float32 and float64; prefill under this backend uses the torch implementation.
Large calls split their sequences over `torch.get_num_threads()` threads.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_decode.c")
DTYPES = {torch.float32: ("float", "expf", ctypes.c_float), torch.float64: ("double", "exp", ctypes.c_double)}
FLAGS = ("-O3", "-funroll-loops", "-fPIC", "-shared", "-fopenmp-simd", "-std=c99")
# Tuned for this CPU (AVX2 and FMA where it has them: ~1.5x faster than the x86-64 baseline
# here); compilers that refuse the flag build without it. The cache key includes the CPU, so a
# home folder shared by different machines never loads a library built for another CPU.
NATIVE = ("-march=native",)

_libraries: dict[torch.dtype, ctypes.CDLL] = {}
_build_error: str | None = None


def _cache_dir() -> Path:
    return Path(os.environ.get("COURSE_LIB_KERNEL_CACHE") or Path.home() / ".cache" / "course_lib" / "kernels")


def _compile(scalar: str, exp: str) -> Path:
    """Path of the shared library for one scalar type, compiled unless already cached."""
    compiler = os.environ.get("CC") or "cc"
    defines = (f"-DSCALAR={scalar}", f"-DEXP={exp}")
    recipe = repr((compiler, FLAGS, NATIVE, defines, _cpu())).encode()
    key = hashlib.sha256(SOURCE.read_bytes() + recipe).hexdigest()[:16]
    target = _cache_dir() / f"paged_decode_{scalar}_{key}.so"
    if target.exists():
        return target
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler: {compiler!r} is not on PATH (set $CC to one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        for extra in (NATIVE, ()):
            cmd = [compiler, *FLAGS, *defines, *extra, str(SOURCE), "-o", str(built), "-lm"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode == 0:
                break
        else:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {' '.join(cmd)}\n{result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent build never sees half a file
    return target


def _cpu() -> str:
    """What identifies this CPU for -march=native: its architecture and feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def load_kernel(dtype: torch.dtype) -> ctypes.CDLL:
    """The compiled kernel for `dtype` (built on first use); ValueError for an unsupported dtype,
    RuntimeError (saying why) when it cannot be built."""
    global _build_error
    if dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise ValueError(f"the cpu attention backend supports {names}, not {str(dtype).removeprefix('torch.')}")
    if dtype in _libraries:
        return _libraries[dtype]
    if _build_error is not None:
        raise RuntimeError(f"the cpu attention backend is unavailable: {_build_error}")
    scalar, exp, c_scalar = DTYPES[dtype]
    try:
        lib = ctypes.CDLL(str(_compile(scalar, exp)))
    except (OSError, RuntimeError) as err:
        _build_error = str(err)
        raise RuntimeError(f"the cpu attention backend is unavailable: {err}") from None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.paged_decode.restype = None
    lib.paged_decode.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                                 c_scalar]
    _libraries[dtype] = lib
    return lib


def available() -> tuple[bool, str]:
    """(True, "") when the kernel is built (or builds now) for float32; else (False, the reason)."""
    try:
        load_kernel(torch.float32)
        return True, ""
    except RuntimeError as err:
        return False, str(err)


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
