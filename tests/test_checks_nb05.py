"""Notebook 05's checks (latency percentiles, the closed-loop driver): the generated reference,
course_lib's counterparts and every control pass on every graded seed; every mutant fails on every
graded seed with a message that names the input, the expected and the got. Run times are printed (no
timed assertion: speed is not a test)."""
from __future__ import annotations

import random
import time

import pytest

from autograder.checks import get_check
from autograder.checks import nb05_hundred_users as checks
from autograder.controls import nb05_hundred_users as controls
from autograder.exercises import of_module
from autograder.mutants import nb05_hundred_users as mutants
from autograder.reference import nb05_hundred_users as reference

EXERCISES = {e.adapter: e for e in of_module("nb05_hundred_users")}


def _verdict(exercise, impl, seed):
    start = time.perf_counter()
    try:
        get_check(exercise)(impl, seed, _allow_reference=True)
        message = None
    except AssertionError as e:
        message = str(e)
    print(f"check_{exercise}({getattr(impl, '__name__', impl)}, seed={seed}): {time.perf_counter() - start:.2f} s")
    return message


def _cases(table):
    return [(ex, impl) for ex in EXERCISES for impl in table[ex]]


def test_every_exercise_has_mutants_and_controls():
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_passes_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert _verdict(exercise, getattr(reference, exercise), seed) is None


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_course_lib_counterpart_passes(exercise):
    from course_lib.sim import closed_loop

    for seed in (*EXERCISES[exercise].graded_seeds, 3):
        assert _verdict(exercise, getattr(closed_loop, exercise), seed) is None


def test_handing_in_course_lib_is_refused():
    from course_lib.sim import closed_loop

    for exercise in EXERCISES:
        with pytest.raises(AssertionError, match="course_lib's reference"):
            get_check(exercise)(getattr(closed_loop, exercise))


@pytest.mark.parametrize("exercise, control", _cases(controls.CONTROLS),
                         ids=[f"{e}-{c.__name__}" for e, c in _cases(controls.CONTROLS)])
def test_every_control_passes_every_graded_seed(exercise, control):
    for seed in EXERCISES[exercise].graded_seeds:
        message = _verdict(exercise, control, seed)
        assert message is None, f"{control.__name__} (correct: {control.__doc__}) failed on seed {seed}: {message}"


@pytest.mark.parametrize("exercise, mutant", _cases(mutants.MUTANTS),
                         ids=[f"{e}-{m.__name__}" for e, m in _cases(mutants.MUTANTS)])
def test_every_mutant_fails_every_graded_seed(exercise, mutant):
    for seed in EXERCISES[exercise].graded_seeds:
        message = _verdict(exercise, mutant, seed)
        assert message, f"{mutant.__name__} ({mutant.__doc__}) passed check_{exercise} on seed {seed}"
        assert len(message) > 40, f"unhelpful message: {message!r}"
        assert exercise in message, f"the message should name the exercise: {message!r}"


def test_the_cases_reach_the_edges():
    """Idle gaps, zero-length steps, times of exactly 0.0, failures that finish last: each is present."""
    for seed in EXERCISES["latency_summary"].graded_seeds:
        cases = checks._summary_cases(random.Random(seed))
        records = [r for case in cases for r in case]
        assert any(r.arrival_time == 0.0 and r.first_token_time == 0.0 for r in records), "a TTFT of 0 at time 0"
        assert any(len(r.token_ids) >= 2 and r.finish_time == r.first_token_time for r in records), "a TPOT of 0"
        assert any(checks._busy_time(c) < 0.5 * (max(r.finish_time for r in c) - min(r.arrival_time for r in c))
                   for c in cases), "an idle gap longer than the busy time"
        assert any(r.finish_reason in ("error", "aborted") for r in records)
        assert any(checks._summary(c)["throughput_tok_s"] == 0.0 and checks._summary(c)["completed"] > 0
                   for c in cases), "a run that took no time"


def test_messages_name_the_broken_rule():
    hints = {
        mutants.summary_truthy_times: "a time of 0.0",
        mutants.summary_busy_time: "idle gaps included",
        mutants.summary_counts_failed_as_completed: "completed = ",
        mutants.closed_loop_waits_for_a_seat: "whether or not the server has a free seat",
    }
    for mutant, expected in hints.items():
        exercise = next(e for e, ms in mutants.MUTANTS.items() if mutant in ms)
        message = _verdict(exercise, mutant, 0)
        assert expected in message, f"{mutant.__name__}: {message}"
