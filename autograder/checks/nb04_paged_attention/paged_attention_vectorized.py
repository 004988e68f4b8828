"""Notebook 04, `paged_attention_vectorized`: as the loops, and without a Python loop over tokens."""
from __future__ import annotations

from autograder._checking import check

from ._shared import _check_attention, _reference_functions


@check("paged_attention_vectorized", forbidden=_reference_functions)
def check_paged_attention_vectorized(impl, seed, allow_reference):
    _check_attention("paged_attention_vectorized", impl, seed, allow_reference, vectorized=True)
