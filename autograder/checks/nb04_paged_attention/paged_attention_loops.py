"""Notebook 04, `paged_attention_loops`: against the oracle, then serving a float64 model's decode rows."""
from __future__ import annotations

from autograder._checking import check

from ._shared import _check_attention, _reference_functions


@check("paged_attention_loops", forbidden=_reference_functions)
def check_paged_attention_loops(impl, seed, allow_reference):
    _check_attention("paged_attention_loops", impl, seed, allow_reference, vectorized=False)
