"""Notebook 02's checks (continuous batching): the generated reference and course_lib's counterparts pass
on every graded seed (that every mutant fails and every control passes on every graded seed, with a
message naming the rule, is tested for all notebooks in tests/test_exercise_table.py); handing in
course_lib (or a thin wrapper of it) is refused. Run times are printed (no timed assertion: speed is
not a test)."""
from __future__ import annotations

import pytest

from autograder.checks import get_check
from autograder.exercises import of_module
from autograder.mutants import nb02_continuous_batching as mutants
from autograder.reference import nb02_continuous_batching as reference
from check_support import counterpart, verdict

EXERCISES = {e.adapter: e for e in of_module("nb02_continuous_batching")}


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None
        assert verdict(exercise, counterpart(exercise), seed) is None


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_handing_in_course_lib_or_a_wrapper_of_it_is_refused(exercise):
    check = get_check(exercise)
    piece = counterpart(exercise)
    if isinstance(piece, type):
        wrapper = type("Wrapper", (piece,), {})
    else:
        def wrapper(*args):
            return piece(*args)
    for impl in (piece, wrapper):
        with pytest.raises(AssertionError, match="course_lib's reference"):
            check(impl)


# The rules the notebook states, each pinned to the mutant that breaks it alone and the words of the
# message that names it (the docs table in docs/exercises/nb02_continuous_batching.md lists the same).
RULE_MESSAGES = {
    "AdmitsAfterPreempting": "no admission in a step that preempted",
    "SkipsRefusedHead": "first come, first served",
    "IgnoresTokenBudget": "max_num_batched_tokens",
    "ChunksBelowTheBudget": "budget used up before",
    "AlwaysChunks": "enable_chunked_prefill is False",
    "BigPromptWaitsForever": "runs alone",
    "IgnoresPrefixCache": "served from the cache",
    "PendingCountsCachedTokens": "not pending any more",
    "EntryBeforeAdmitting": "build the entry after admitting",
    "AdmitsBeforeRunning": "served first",
    "OneAdmissionPerStep": "every free seat in the same step",
    "OvertakesHeadWithoutPages": 'Rule "first come, first served"',
    "IgnoresMakeRoomRefusal": 'Rule "never out of pages"',
    "ChargesCachedTokens": "cost no budget",
}


@pytest.mark.parametrize("mutant", sorted(RULE_MESSAGES))
def test_each_scheduler_rule_is_named_by_its_message(mutant):
    message = verdict("StudentScheduler", getattr(mutants, mutant), 0)
    assert message and RULE_MESSAGES[mutant] in message, message


def test_the_sweep_rows_are_the_simulated_clock_s_exact_numbers():
    """The counterpart measured twice gives the same rows, and a small and a big budget show the trade."""
    from course_lib.sim.token_budget import budget_sweep
    from course_lib.sim.workload import LengthDist, open_loop

    specs = open_loop(30, 30.0, prompt_dist=LengthDist.uniform(200, 900), output_dist=LengthDist.uniform(4, 30), seed=1)
    first, again = budget_sweep([32, 2048], specs), budget_sweep([32, 2048], specs)
    assert first == again
    small, big = first
    assert small["ttft_p50_ms"] > big["ttft_p50_ms"] and small["itl_p99_ms"] < big["itl_p99_ms"], first


# Every rule of the notebook's collapsed blocks is named by the failure of the mutant that breaks it (issue 24:
# a student who designed it differently learns which rule to open).
RULE_NAMES = {
    "StudentScheduler": {
        "IgnoresTokenBudget": "token budget", "ChunksBelowTheBudget": "token budget",
        "AdmitsBeforeRunning": "running first", "OneAdmissionPerStep": "the turnstile",
        "WaitsForEmptyBatch": "the turnstile", "SkipsRefusedHead": "first come, first served",
        "OvertakesHeadWithoutPages": "first come, first served",
        "AdmitsAfterPreempting": "no admission after preempting", "AlwaysChunks": "chunked prefill off",
        "BigPromptWaitsForever": "chunked prefill off", "NoPreemption": "never out of pages",
        "IgnoresMakeRoomRefusal": "never out of pages", "IgnoresAdmissionPolicy": "the policy decides",
        "IgnoresPrefixCache": "prefix hits skipped", "PendingCountsCachedTokens": "prefix hits skipped",
        "EntryBeforeAdmitting": "prefix hits skipped", "ChargesCachedTokens": "prefix hits skipped",
        "NeverRetires": "retire at once", "LeaksPages": "retire at once",
    },
    "mean_batch_occupancy": {
        "occupancy_unweighted": "weighted by duration", "occupancy_over_span": "weighted by duration",
        "occupancy_any_untimed_equal": "weighted by duration", "occupancy_no_fallback": "untimed steps equal",
        "occupancy_empty_crashes": "no steps", "occupancy_not_a_fraction": "a fraction of the seats",
        "occupancy_counts_waiting": "a fraction of the seats", "occupancy_as_a_tensor": "a fraction of the seats",
    },
    "budget_sweep": {
        "sweep_waits_past_arrival": "enter on arrival", "sweep_submits_all_at_once": "enter on arrival",
        "sweep_sorts_budgets": "one row per budget", "sweep_one_engine": "fresh engine per budget",
        "sweep_stamps_step_start": "the measurements", "sweep_in_seconds": "the measurements",
    },
}


@pytest.mark.parametrize("exercise,mutant", [(e, m) for e, ms in RULE_NAMES.items() for m in sorted(ms)])
def test_each_mutant_s_failure_names_its_rule(exercise, mutant):
    for seed in EXERCISES[exercise].graded_seeds:
        message = verdict(exercise, getattr(mutants, mutant), seed)
        assert message and message.startswith(f'Rule "{RULE_NAMES[exercise][mutant]}"'), message


def test_a_spinning_sweep_fails_fast_naming_the_cap():
    """`<` for `<=` in the arrival test spins for ever on the idle clock: the check stops it at its cap."""
    import time

    start = time.perf_counter()
    message = verdict("budget_sweep", mutants.sweep_waits_past_arrival, 0)
    assert "without an engine step in between" in message and "(<=, not <)" in message, message
    assert time.perf_counter() - start < 10
