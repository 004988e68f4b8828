"""Notebook 03, `paged_waste`: the slots left empty in each sequence's last page."""
from __future__ import annotations

import random

from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, show

from ._shared import _waste_cases, _waste_module


@check("paged_waste")
def check_paged_waste(impl, seed, allow_reference):
    rng = random.Random(seed)
    for tokens in _waste_cases(rng, True):
        for ps in (4, 16, rng.choice([1, 3, 8])):
            shown = f"paged_waste({tokens}, page_size={ps})"
            with forbid_calls("paged_waste", _waste_module(), enabled=not allow_reference):
                got = call(shown, impl, list(tokens), ps)
            want = sum(-(-n // ps) * ps - n for n in tokens)
            expect(type(got) is int, lambda: f"{shown} must return an int (a number of slots), got {kind_of(got)} "
                                             f"{show(got)}", rule="an int")
            if got != want:
                message = (f"{shown} = {got}, expected {want}: each request holds ceil(n / page_size) pages; the "
                           "unused slots of its last page are the waste.")
                if got == sum(-(-n // ps) - n / ps for n in tokens) or got == sum(-(-n // ps) for n in tokens):
                    broke("slots, not pages", message + " Count slots, not pages.")
                hint = ""
                if got == sum((n // ps + 1) * ps - n for n in tokens):
                    hint = (" It reserves one page too many when a request fills its last page exactly: "
                            "pages = ceil(n / page_size) = -(-n // page_size).")
                elif got == sum(max(1, -(-n // ps)) * ps - n for n in tokens):
                    hint = " A request with 0 tokens holds no page yet."
                broke("whole pages", message + hint)
