"""Notebook 03, `contiguous_waste`: the slots reserved up to `max_len` and never used."""
from __future__ import annotations

import random

from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, show

from ._shared import _waste_cases, _waste_module


@check("contiguous_waste")
def check_contiguous_waste(impl, seed, allow_reference):
    rng = random.Random(seed)
    for tokens in _waste_cases(rng, False):
        tokens = [max(1, n) for n in tokens]
        for max_len in (max(tokens), 64, rng.choice([100, 128, 2048])):
            shown = f"contiguous_waste({tokens}, max_len={max_len})"
            with forbid_calls("contiguous_waste", _waste_module(), enabled=not allow_reference):
                got = call(shown, impl, list(tokens), max_len)
            want = sum(max_len - n for n in tokens)
            expect(type(got) is int, lambda: f"{shown} must return an int (a number of slots), got {kind_of(got)} "
                                             f"{show(got)}", rule="an int")
            if got != want:
                hint = ""
                if got == sum(max(tokens) - n for n in tokens) and max_len != max(tokens):
                    hint = " Each request reserves max_len slots, not the longest request's length."
                elif got == len(tokens) * max_len:
                    hint = " Subtract the slots each request actually fills."
                broke("max_len each", f"{shown} = {got}, expected {want}: every request reserves max_len slots up "
                                      "front; the "
                     f"ones it does not fill are the waste.{hint}")
