"""Notebook 01, `static_generate_cached`: the loop with a KV cache; one prefill, then one new token
per row in every pass."""
from __future__ import annotations

from autograder._checking import broke, check, expect

from ._shared import _course_lib_batching, _expect_pass_count, _expect_tokens, _run_static, _static_cases


def _expect_positions(shown, prompts, want, fed, positions):
    """Rule "no gaps in positions": within each row, each real token sits one position after the row's
    previous real token. Read from the positions the model was given, for a row's real slots only, and
    only while the ids it is fed are the ones the model's own answer gives (after a wrong token the
    tokens' rule speaks). Left padding, as pad_batch builds it: a row's prompt ends the prefill's row."""
    B, L = len(prompts), max(len(p) for p in prompts)
    if not positions or positions[0] is None or len(fed[0]) != B * L:
        return
    for r, prompt in enumerate(prompts):
        n = len(prompt)
        row_ids = fed[0][r * L:(r + 1) * L]
        if row_ids[L - n:] != list(prompt):
            continue
        row_pos = positions[0][r * L:(r + 1) * L][L - n:]
        for j in range(1, n):
            if row_pos[j] != row_pos[j - 1] + 1:
                broke("no gaps in positions",
                      f"{shown}: in the prefill, row {r}'s prompt tokens {j - 1} and {j} were given positions "
                      f"{row_pos[j - 1]} and {row_pos[j]}: each real token sits one position after the previous one "
                      f"(padding takes no position): the row's positions were {row_pos}")
        last = row_pos[-1]
        for k in range(1, len(fed)):
            if k >= len(want[r]) or positions[k] is None or len(fed[k]) != B or fed[k][r] != want[r][k - 1]:
                break
            if positions[k][r] != last + 1:
                broke("no gaps in positions",
                      f"{shown}: forward pass {k} fed row {r}'s token {fed[k][r]} at position {positions[k][r]}, but "
                      f"the row's previous real token sat at position {last}: it belongs at {last + 1} (the row has "
                      f"{n} prompt tokens and {k - 1} generated ones before it; padding takes no position)")
            last = positions[k][r]


@check("static_generate_cached", forbidden=lambda: (_course_lib_batching().static_generate_cached,))
def check_static_generate_cached(impl, seed, allow_reference):
    for model, label, prompts, max_tokens, eos, want in _static_cases(seed):
        shown, rows, passes, fed, positions = _run_static("static_generate_cached", impl, model, label, prompts,
                                                          max_tokens, eos, allow_reference)
        B, L = len(prompts), max(len(p) for p in prompts)
        expect(passes, f"{shown} never ran the model (no forward pass fed any token)", rule="one prefill")
        if passes[0] != B * L:
            broke("one prefill", f"{shown}: the first forward pass fed {passes[0]} tokens; the prefill runs the whole "
                                 f"padded batch once: {B} rows x {L} columns (the longest prompt) = {B * L} tokens"
                                 + (", not one column at a time" if passes[0] == B else "") + ".")
        for k, tokens in enumerate(passes[1:], start=1):
            if tokens != B:
                if tokens == B * (L + k):
                    why = ("that is the whole rectangle again: the cache already holds every earlier column, "
                           "feed only the newest token of each row")
                elif tokens < B:
                    why = ("fewer than the rows: a static batch carries EVERY row, finished ones as padding, "
                           "until the whole batch is done")
                else:
                    why = "feed exactly one new token per row; the cache holds the rest"
                broke("one token per row", f"{shown}: forward pass {k} (a decode step) fed {tokens} tokens; expected "
                                           f"{B} (one new token for each of the {B} rows): {why}.")
        _expect_positions(shown, prompts, want, fed, positions)
        _expect_tokens(shown, prompts, rows, want, eos)
        _expect_pass_count(shown, passes, want, max_tokens, eos)
