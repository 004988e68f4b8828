"""Notebook 01, `padding_waste`: the share of computed slots that pad, against its definition."""
from __future__ import annotations

import random

from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, plain_float, same_float, show

from ._shared import _course_lib_batching, _expect_value_error


def _waste(prompt_lens, output_lens):
    batch = len(prompt_lens)
    total = batch * max(prompt_lens) + batch * (max(output_lens) - 1)
    useful = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    return (total - useful) / total


def _waste_broken_rule(p, o, got) -> tuple[str, str]:
    """(rule, hint) for a wrong fraction: a common wrong count by its value, else the rule the case isolates
    (the first cases each have padding of one kind only)."""
    b, pm, om = len(p), max(p), max(o)
    alternatives = [
        ("decode until the longest", "max(output_lens) decode steps; the prefill already samples the first "
         "output token, so the batch decodes max(output_lens) - 1 steps",
         (b * (pm + om) - sum(p) - sum(o)) / (b * (pm + om))),
        ("prefill at the longest", "only the decode padding; the prefill pads every prompt to the longest too",
         (b * (om - 1) - sum(n - 1 for n in o)) / max(1, b * (om - 1) + b * pm)),
        ("decode until the longest", "only the prefill padding; finished rows keep decoding until the longest "
         "output is done", (b * pm - sum(p)) / (b * pm + b * (om - 1))),
        ("padding over all computed", "padding / useful slots; the waste is padding / ALL computed slots",
         (b * pm + b * (om - 1) - sum(p) - sum(n - 1 for n in o)) / max(1, sum(p) + sum(n - 1 for n in o))),
        ("padding over all computed", "the useful fraction; the question is the padding fraction (1 - useful)",
         (sum(p) + sum(n - 1 for n in o)) / (b * pm + b * (om - 1))),
    ]
    want = _waste(p, o)
    for rule, reason, value in alternatives:
        if same_float(got, value) and not same_float(value, want):
            return rule, f" It looks like you counted {reason}."
    if abs(got - want) < 1e-4:
        return "exact", " It is close, not exact: compute the fraction from the counts, do not round it."
    if b == 1:
        return "real slots", " A batch of one request computes only its own tokens: nothing is padding."
    if om == 1:
        return "prefill at the longest", " Every answer here is the prefill's token alone: no decode step runs."
    if len(set(p)) == 1:
        return "decode until the longest", " The prompts all have one length here: the padding is all in the decode."
    return "padding over all computed", ""


def _waste_cases(rng: random.Random):
    # First one request (no padding at all), then padding from the prefill alone (every answer is the
    # prefill's token), then from the decode alone (equal prompts): a wrong count fails on the case
    # that isolates the rule it broke. Then both kinds together.
    cases = [([7], [5]), ([3, 5], [1, 1]), ([4, 4, 4], [1, 1, 1]), ([6, 6, 6], [9, 3, 1]), ([6, 6], [9, 9]),
             ([3, 5], [4, 2]), ([2, 9, 4], [1, 12, 1])]
    for _ in range(4):
        batch = rng.randint(2, 8)
        cases.append(([rng.randint(1, 40) for _ in range(batch)], [rng.randint(1, 30) for _ in range(batch)]))
    cases.append(([rng.randint(1, 20) for _ in range(32)], [20] * 31 + [1000]))  # one long answer among many
    # A big batch (300 > 256): lengths above CPython's cached small ints, so comparing them with `is`
    # instead of `==` shows here.
    cases.append(([rng.randint(1, 50) for _ in range(300)], [rng.randint(1, 50) for _ in range(300)]))
    return cases


def _show_lens(lens) -> str:
    """A list of lengths as a message shows it: whole up to 40, else its start and its size."""
    return str(lens) if len(lens) <= 40 else f"[{', '.join(map(str, lens[:8]))}, ... ({len(lens)} lengths)]"


@check("padding_waste", forbidden=lambda: (_course_lib_batching().padding_waste,))
def check_padding_waste(impl, seed, allow_reference):
    for prompt_lens, output_lens in _waste_cases(random.Random(seed)):
        shown = f"padding_waste({_show_lens(prompt_lens)}, {_show_lens(output_lens)})"
        with forbid_calls("padding_waste", [_course_lib_batching()], enabled=not allow_reference):
            got = call(shown, impl, list(prompt_lens), list(output_lens))
        want = _waste(prompt_lens, output_lens)
        expect(plain_float(got) is not None, lambda: f"{shown} must return a float (a fraction), got {kind_of(got)} "
                                                     f"{show(got)}", rule="padding over all computed")
        got = plain_float(got)
        if not same_float(got, want):
            rule, hint = _waste_broken_rule(prompt_lens, output_lens, got)
            broke(rule, f"{shown} = {got!r}, expected {want!r}.{hint}")
    for p, o, why in (([3, 5, 2], [4, 2], "3 prompt lengths but 2 output lengths: one of each per request"),
                      ([3, 5], [4, 2, 1], "2 prompt lengths but 3 output lengths: one of each per request"),
                      ([], [], "no requests: the fraction of nothing is undefined"),
                      ([3, 5], [4, 0], "an output length of 0: the prefill always yields a first token"),
                      ([0, 5], [4, 2], "a prompt length of 0: every request has at least one prompt token")):
        _expect_value_error(f"padding_waste({p}, {o})", lambda p=p, o=o: impl(list(p), list(o)), why=why)
