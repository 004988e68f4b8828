"""Notebook 01, `static_generate`: the loop without a cache; pass k recomputes the whole rectangle."""
from __future__ import annotations

from autograder._checking import broke, check

from ._shared import _course_lib_batching, _expect_pass_count, _expect_tokens, _run_static, _static_cases


@check("static_generate", forbidden=lambda: (_course_lib_batching().static_generate,))
def check_static_generate(impl, seed, allow_reference):
    for model, label, prompts, max_tokens, eos, want in _static_cases(seed):
        shown, rows, passes, _, _ = _run_static("static_generate", impl, model, label, prompts, max_tokens, eos,
                                                allow_reference)
        _expect_tokens(shown, prompts, rows, want, eos)
        B, L = len(prompts), max(len(p) for p in prompts)
        for k, tokens in enumerate(passes[:max(len(w) for w in want)]):
            if tokens != B * (L + k):
                unfinished = sum(len(w) > k for w in want)  # rows that still needed a token at pass k
                rule = "the whole rectangle"
                if tokens == B and k > 0:
                    why = ("it fed one token per row: that is a KV cache, the NEXT exercise. This one is the "
                           "no-cache baseline: every step runs the whole rectangle again (padded_forward)")
                elif unfinished < B and tokens % unfinished == 0 and tokens // unfinished <= L + k:
                    rule = "finished rows stay"
                    why = (f"it looks like only the {unfinished} unfinished row(s) rode along: a static batch "
                           "carries EVERY row (finished ones as padding) in every pass")
                else:
                    why = "every pass carries all the rows, and the batch grows by one column per step"
                broke(rule, f"{shown}: forward pass {k} fed {tokens} tokens; without a cache it computes all {B} rows "
                            f"over the whole padded width {L} + {k} = {B} x {L + k} = {B * (L + k)} tokens; {why}.")
        _expect_pass_count(shown, passes, want, max_tokens, eos)
