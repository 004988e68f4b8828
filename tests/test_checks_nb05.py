"""Notebook 05's checks (latency percentiles, the closed-loop driver): course_lib's
counterparts pass on every graded seed, the cases reach the edges, each rule has its
own message (that the generated reference passes and every mutant fails and every control passes on every graded seed is tested for all
notebooks in tests/test_exercise_table.py). Run times are printed (no
timed assertion: speed is not a test)."""
from __future__ import annotations

import random

import pytest

from autograder.checks import get_check
from autograder.checks.nb05_hundred_users import latency_summary as checks
from autograder.exercises import of_module
from autograder.mutants import nb05_hundred_users as mutants
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb05_hundred_users")}


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_course_lib_counterpart_passes(exercise):
    from course_lib.sim import closed_loop

    for seed in (*EXERCISES[exercise].graded_seeds, 3):
        assert verdict(exercise, getattr(closed_loop, exercise), seed) is None


def test_handing_in_course_lib_is_refused():
    from course_lib.sim import closed_loop

    for exercise in EXERCISES:
        with pytest.raises(AssertionError, match="course_lib's reference"):
            get_check(exercise)(getattr(closed_loop, exercise))


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
        message = verdict(exercise, mutant, 0)
        assert expected in message, f"{mutant.__name__}: {message}"


RULE_NAMES = {
    "summary_nearest_rank": "linear percentiles", "summary_unsorted": "linear percentiles",
    "summary_tpot_over_n": "TPOT after the first", "summary_includes_failed": "completed only",
    "summary_ttft_from_scheduling": "TTFT from arrival", "summary_truthy_times": "zero is a time",
    "summary_busy_time": "throughput over the makespan", "summary_counts_failed_as_completed": "exact counters",
    "summary_drops_empty_answers": "exact counters", "summary_rebases_the_records": "inputs unchanged",
    "summary_percentiles_as_arrays": "the dict asked for",
    "closed_loop_all_at_once": "send when answered", "closed_loop_waves": "send when answered",
    "closed_loop_one_user": "send when answered", "closed_loop_one_extra": "one engine, one rng",
    "closed_loop_finish_order": "finished, in sent order", "closed_loop_rng_per_request": "one engine, one rng",
}


@pytest.mark.parametrize("mutant", sorted(RULE_NAMES))
def test_each_mutant_s_failure_names_its_rule(mutant):
    """The rule names are those of the notebook's collapsed blocks (issue 24)."""
    fn = getattr(mutants, mutant)
    exercise = next(e for e, ms in mutants.MUTANTS.items() if fn in ms)
    for seed in (0, 1, 2):
        message = verdict(exercise, fn, seed)
        assert message and message.startswith(f'Rule "{RULE_NAMES[mutant]}"'), message


def test_a_zero_length_answer_counts_as_completed():
    """A completed request without a token counts in `completed` and has a latency (issue 24's zero-length
    requests): the mutant that drops it fails naming the counters."""
    message = verdict("latency_summary", mutants.summary_drops_empty_answers, 0)
    assert "completed" in message and "no token" in message, message
