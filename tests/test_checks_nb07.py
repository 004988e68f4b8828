"""Notebook 07's checks (admission control, preemption, the break-it experiment): the generated
reference and course_lib's counterparts pass on every graded seed (that every mutant fails and every
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
from autograder.reference import nb07_admission_control as reference
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb07_admission_control")}


def test_every_exercise_has_mutants_and_controls():
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_passes_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None


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


