"""Attention that reads keys and values through page tables.

Cache layout (one pair per layer): `k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim]`.
Token `t` of a sequence lives in page `block_tables[s, t // page_size]`, row `t % page_size`.

Two entry points, each with backends "reference" (explicit loops, as the course teaches it),
"torch" (vectorised gather + masked softmax), "triton" (GPU kernel; runs on the CPU under
TRITON_INTERPRET=1) and "cpu" (a C kernel compiled on first use, decode only: its prefill is
the torch one):

- `paged_decode`: one new query per sequence (the decode step).
- `paged_prefill`: a chunk of new queries per sequence, causal, offset by the tokens already
  cached (prefill and chunked prefill; a decode is the special case of a chunk of one).

Both expect the new tokens' keys and values to be in the cache already (`write_kv`).
"""
from __future__ import annotations

import torch

from .kv_write import write_kv
from .reference import paged_decode_reference, paged_prefill_reference
from .torch_paged import paged_decode_torch, paged_prefill_torch

BACKENDS = ("reference", "torch", "triton", "cpu")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, backend: str = "torch", **kwargs):
    """q: [num_seqs, num_heads, head_dim]; block_tables: int32 [num_seqs, max_pages];
    seq_lens: int32 [num_seqs] (tokens cached, including the one being decoded).
    Returns [num_seqs, num_heads, head_dim]."""
    _check_backend(backend)
    if backend == "reference":
        return paged_decode_reference(q, k_cache, v_cache, block_tables, seq_lens, scale)
    if backend == "torch":
        return paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale)
    if backend == "cpu":
        from .cpu_decode import paged_decode_cpu

        return paged_decode_cpu(q, k_cache, v_cache, block_tables, seq_lens, scale)
    from .triton_decode import paged_decode_triton

    return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, **kwargs)


def paged_prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, backend: str = "torch",
                  **kwargs):
    """q: [num_tokens, num_heads, head_dim], sequence s owns rows query_start_loc[s]:query_start_loc[s+1];
    those are the *last* n_s of its seq_lens[s] cached tokens, each attending causally to everything
    up to and including itself. Returns [num_tokens, num_heads, head_dim]."""
    _check_backend(backend)
    if backend == "reference":
        return paged_prefill_reference(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
    if backend in ("torch", "cpu"):  # the cpu backend's kernel is decode only
        return paged_prefill_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
    from .triton_prefill import paged_prefill_triton

    return paged_prefill_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, **kwargs)


def default_backend(device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """Triton on CUDA when it imports; on the CPU the C kernel when it builds and supports
    `dtype` (float32, float64); the vectorised torch backend everywhere else."""
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401

            return "triton"
        except ImportError:
            return "torch"
    if torch.device(device).type == "cpu":
        from ..native import DTYPES
        from .cpu_decode import available

        if (dtype is None or dtype in DTYPES) and available()[0]:
            return "cpu"
    return "torch"


__all__ = ["paged_decode", "paged_prefill", "write_kv", "default_backend", "BACKENDS"]
