"""Notebook 02's checks (continuous batching): the generated reference and course_lib's counterparts pass
on every graded seed (that every mutant fails and every control passes on every graded seed, with a
message naming the rule, is tested for all notebooks in tests/test_exercise_table.py); handing in
course_lib (or a thin wrapper of it) is refused. Run times are printed (no timed assertion: speed is
not a test)."""
from __future__ import annotations

import pytest

from autograder.checks import get_check
from autograder.controls import nb02_continuous_batching as controls
from autograder.exercises import of_module
from autograder.mutants import nb02_continuous_batching as mutants
from autograder.reference import nb02_continuous_batching as reference
from check_support import counterpart, verdict

EXERCISES = {e.adapter: e for e in of_module("nb02_continuous_batching")}


def test_every_exercise_has_mutants_and_controls():
    assert set(EXERCISES) == {"StudentScheduler", "mean_batch_occupancy", "budget_sweep"}
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


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
