"""Scatter new keys and values into their physical slots."""
from __future__ import annotations

import torch


def write_kv(k_cache, v_cache, k, v, slot_mapping: torch.Tensor, may_skip: bool = True) -> None:
    """k, v: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens], slot = page * page_size + row.
    A negative slot means "do not store". Callers that never pass one say `may_skip=False`, which
    saves a check (and, on a GPU, a device-to-host sync) in every layer."""
    num_pages, page_size = k_cache.shape[:2]
    flat_k = k_cache.view(num_pages * page_size, *k_cache.shape[2:])
    flat_v = v_cache.view(num_pages * page_size, *v_cache.shape[2:])
    if may_skip and bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        slot_mapping, k, v = slot_mapping[keep], k[keep], v[keep]
    flat_k.index_copy_(0, slot_mapping, k if k.dtype == k_cache.dtype else k.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, v if v.dtype == v_cache.dtype else v.to(v_cache.dtype))
