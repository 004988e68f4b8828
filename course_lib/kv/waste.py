"""KV waste: slots reserved for requests but holding none of their tokens.

Paged: a request holding n tokens has just enough whole pages for them (none for n = 0); the
empty rows of its last page are the waste. Contiguous: each request reserved max_len slots up
front; everything beyond its n tokens is. Notebook 3's exercises of the same names are held
to these.
"""
from __future__ import annotations

from collections.abc import Sequence


def paged_waste(num_tokens_per_request: Sequence[int], page_size: int) -> int:
    return sum(-(-n // page_size) * page_size - n for n in num_tokens_per_request)


def contiguous_waste(num_tokens_per_request: Sequence[int], max_len: int) -> int:
    return sum(max_len - n for n in num_tokens_per_request)
