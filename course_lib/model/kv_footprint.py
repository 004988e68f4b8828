"""What one cached token costs in memory: the number every KV budget of the course is built on.

Notebook 0 asks the student to write this function (`kv_bytes_per_token`); the cells after that
exercise fall back to this one while theirs is unfinished. It lives on its own, away from the
contiguous cache that notebook 1 asks students to read, so that reading one exercise's material
never shows another exercise's answer.
"""
from __future__ import annotations


def kv_bytes_per_token(config, bytes_per_elem: int) -> int:
    """Bytes one cached token costs: a key and a value vector per KV head, in every layer."""
    return int(2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem)
