"""Notebook 07's checks (admission control, preemption, the break-it experiment): course_lib's
counterparts pass on every graded seed (that the generated reference passes and every mutant fails and every
control passes on every graded seed, with a message naming the rule, is tested for all notebooks in
tests/test_exercise_table.py). Run times are printed (no timed assertion: speed is not a test)."""
from __future__ import annotations

import re

import pytest

from autograder._checking import REFERENCE_MESSAGE
from autograder.checks import get_check
from autograder.controls import nb07_admission_control as controls
from autograder.exercises import of_module
from autograder.mutants import nb07_admission_control as mutants
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb07_admission_control")}


def test_course_lib_counterparts_pass():
    from course_lib.scheduler.admission import WatermarkAdmission
    from course_lib.sim.preemption import preemption_report

    for exercise, impl in (("StudentWatermark", WatermarkAdmission), ("preemption_report", preemption_report)):
        for seed in EXERCISES[exercise].graded_seeds:
            assert verdict(exercise, impl, seed) is None


def test_handing_in_course_lib_preemption_is_refused():
    """course_lib's scheduler as it is, or a subclass whose hooks only call course_lib's, gets no credit."""
    from course_lib.scheduler.continuous import ContinuousScheduler

    class Delegating(ContinuousScheduler):
        def choose_victim(self):
            return super().choose_victim()

        def preempt(self, request):
            super().preempt(request)

    for impl in (ContinuousScheduler, Delegating):
        with pytest.raises(AssertionError, match=re.escape(REFERENCE_MESSAGE)):
            get_check("StudentRecompute")(impl, 0)


def test_any_safe_victim_policy_passes():
    """Issue 24: the check holds safety and liveness, not youngest-first: course_lib's three policies pass."""
    from course_lib.scheduler.victims import POLICIES

    for name, cls in POLICIES.items():
        class Policy(cls):  # its own hooks (the check refuses a class that keeps course_lib's), course_lib's bodies
            def choose_victim(self):
                return cls.choose_victim(self)

            def preempt(self, request):
                controls.RecomputeAskerYields.preempt(self, request)

        for seed in EXERCISES["StudentRecompute"].graded_seeds:
            assert verdict("StudentRecompute", Policy, seed) is None, name


RULE_MUTANTS = {
    "StudentRecompute": {"a running victim": ["VictimOldest", "VictimLargest", "VictimLeastWork"],
                         "front of the queue": ["RequeueAtBack"], "progress restarts": ["KeepsProgress"],
                         "pages through the manager": ["NeverFreesPages"], "in place": ["RebindsQueues"],
                         "not counted": ["CountsItself"], "tokens kept": ["RestartsAnswer"],
                         "only answers": ["ChoosingTakesOut"], "out of the batch": ["LeavesVictimRunning"],
                         "status preempted": ["StatusStillRunning"], "same answers": ["AnswerIntoPrompt"]},
    "break_it_config": {"holds the largest request": ["break_it_pool_below_largest_request"],
                        "breaks without control": ["break_it_too_light"],
                        "values in range": ["break_it_watermark_in_percent", "break_it_as_a_tuple"]},
    "StudentWatermark": {"a valid fraction": ["NoValidation"], "exactly is allowed": ["StrictlyAbove"],
                         "count every page": ["IgnoresCachedPages"], "only decides": ["ReservesPages"]},
    "preemption_report": {"distinct requests": ["report_events_as_requests"], "any engine state": ["report_finished_only"],
                          "every event": ["report_counts_steps"], "the worst case": ["report_max_from_steps"],
                          "plain ints": ["report_numpy_counts"]},
}


@pytest.mark.parametrize("exercise,rule,name", [(e, r, n) for e, rules in RULE_MUTANTS.items()
                                                for r, names in rules.items() for n in names])
def test_the_failure_names_the_broken_rule(exercise, rule, name):
    for seed in EXERCISES[exercise].graded_seeds:
        message = verdict(exercise, getattr(mutants, name), seed)
        assert message is not None and message.startswith(f'Rule "{rule}": '), (seed, message)


def test_the_largest_request_rule_matches_the_engine():
    """largest_request_slots is what the engine refuses at the door: one page less holds no such request."""
    from autograder.checks.nb07_admission_control import largest_request_slots
    from course_lib import EngineConfig, LLMEngine, SamplingParams
    from course_lib.sim.simulate import scripted_model_config

    for max_tokens in (1, 256, 600, 1024):
        slots = largest_request_slots(max_tokens)
        for pages, fits in ((slots // 16, True), (slots // 16 - 1, False)):
            engine = LLMEngine(scripted_model_config(2048), EngineConfig(page_size=16, num_pages=pages,
                                                                         max_model_len=2048))
            try:
                engine.add_request([5] * 1024, SamplingParams(max_tokens=max_tokens), scripted_output_len=1)
                added = True
            except ValueError:
                added = False
            assert added == fits, (max_tokens, pages)


def test_serve_users_is_deterministic_and_takes_policy_objects():
    from course_lib.scheduler.admission import WatermarkAdmission
    from course_lib.scheduler.victims import OldestFirst
    from course_lib.sim.policy_runs import serve_users
    from course_lib.sim.simulate import make_engine_config

    config = make_engine_config(kv_tokens=2048, page_size=16, admission="none", preemption="recompute")
    runs = [serve_users(config, 8, 30, max_tokens=256, seed=1, admission=WatermarkAdmission(0.1), scheduler=OldestFirst)
            for _ in range(2)]
    assert runs[0][0] == runs[1][0] and runs[0][0]["requests_completed"] == 30
