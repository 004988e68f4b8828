"""Every exercise of the table (autograder/exercises.py) graded the way `python -m autograder grade`
grades it: the check call recorded through the membrane, as the sandbox records it, then replayed
against the grader's own check, whose verdict counts. The other fast tests call the checks directly
with `_allow_reference=True`, which bypasses the membrane, so an exercise could pass them and still
fail in real grading (a grader list its code mutates on a copy, a callback the replay refuses).

For each exercise, on its visible seed: the generated reference passes in the kernel and on replay;
the first hand-written mutant of its list (autograder/mutants/<module>.py) fails in both, with the
same message, from the check itself (not from a record that diverged). The implementations are
loaded from copies outside the autograder, as a student's code is (otherwise the check would refuse
them as the autograder's answer key before anything else). Kernel-free: about 20 s for all 25
exercises on a 2-core machine (StudentScheduler and budget_sweep are the slowest, ~3 s each).
"""
from __future__ import annotations

import importlib

import pytest
from check_support import record_check_call, student_copy_fixture

from autograder._checking import REFERENCE_MESSAGE
from autograder.checks import get_check
from autograder.exercises import EXERCISES
from autograder.replay import replay

student_copy = student_copy_fixture("roundtrip")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """`recorded(exercise, impl)`: (the record entry of one check call on the visible seed, the kernel's
    outcome: None if it passed, else the AssertionError's message), recorded as the sandbox records it."""
    folder = tmp_path_factory.mktemp("records")

    def run(exercise, impl):
        return record_check_call(folder / f"{exercise.adapter}-{impl.__name__}.jsonl", exercise.adapter, impl)

    return run


def first_mutant_name(exercise) -> str:
    mutants = importlib.import_module(f"autograder.mutants.{exercise.module}").MUTANTS.get(exercise.adapter)
    assert mutants, f"{exercise.adapter}: no mutant in autograder/mutants/{exercise.module}.py (write at least 3)"
    return mutants[0].__name__


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_the_reference_passes_through_the_membrane(exercise, student_copy, recorded):
    reference = getattr(student_copy("reference", exercise.module), exercise.adapter)
    entry, outcome = recorded(exercise, reference)
    assert outcome is None, f"the reference fails its check while recorded: {outcome}"
    assert replay(get_check(exercise.adapter), entry) == (True, ""), (
        "the reference passes in the kernel but not on the grader's replay of its record")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_its_first_mutant_fails_through_the_membrane_with_the_same_message(exercise, student_copy, recorded):
    mutant = getattr(student_copy("mutants", exercise.module), first_mutant_name(exercise))
    entry, outcome = recorded(exercise, mutant)
    assert outcome is not None, f"{mutant.__name__} passes its check while recorded"
    ok, message = replay(get_check(exercise.adapter), entry)
    assert not ok, f"{mutant.__name__} fails in the kernel ({outcome[:200]}) but passes on replay"
    assert "does not answer" not in message, f"the mutant should fail the check itself, not diverge: {message}"
    assert message == f"AssertionError: {outcome}", ("the replay's verdict differs from the kernel's:\n"
                                                     f"kernel: {outcome}\nreplay: {message}")


def _function_counterparts():
    import inspect

    from check_support import counterpart

    found = []
    for e in EXERCISES:
        if e.counterpart and inspect.isfunction(counterpart(e.adapter)):
            found.append(e)
    return found


@pytest.mark.parametrize("exercise", _function_counterparts(), ids=lambda e: e.adapter)
def test_a_wrapper_of_course_libs_piece_is_refused_in_the_kernel_and_on_replay(exercise, recorded):
    """A function that merely calls course_lib's counterpart: where the kernel refuses it (forbid_calls), the
    grader's replay must refuse it too. (forbid_calls once read the watched calls before the replay had
    filled them in from the record, so such a wrapper failed in the notebook and passed the grade.)"""
    from check_support import counterpart

    piece = counterpart(exercise.adapter)

    def wrapper(*args, **kwargs):
        return piece(*args, **kwargs)

    wrapper.__name__ = f"{exercise.adapter}_wrapper"  # (its own record file: the fixture names them after it)
    entry, outcome = recorded(exercise, wrapper)
    ok, message = replay(get_check(exercise.adapter), entry)
    # No credit for it anywhere: the kernel refuses it as course_lib's (nb00's kv_bytes_per_token once gave
    # a wrapper full marks), and the replay agrees.
    assert outcome is not None and REFERENCE_MESSAGE in outcome, f"the wrapper is not refused: {outcome}"
    assert not ok, f"the wrapper fails in the kernel ({outcome[:200]}) but passes on the grader's replay"
    assert message == f"AssertionError: {outcome}"


def test_wrappers_are_refused_somewhere():
    """The test above is not vacuous: course_lib's pieces that are plain functions exist in several notebooks."""
    assert len(_function_counterparts()) >= 5


def test_a_function_calling_the_checks_own_answer_is_refused_in_the_kernel_and_on_replay(recorded):
    """The check computes the right answer itself; a student's function reaching that code through
    `sys.modules` (the sixth red team: `getattr(sys, "mod" + "ules")[...]`) earned full marks. Recording for
    the grader, a call the student's code makes itself into its check's package is refused like a call of
    course_lib's counterpart (the check's callbacks reach the student's code through the membrane's
    proxies, so a call of theirs is not the student's own)."""
    import sys

    from autograder.exercises import BY_ADAPTER

    exercise = BY_ADAPTER["preemption_report"]

    def preemption_report_through_the_check(engine):
        return sys.modules["autograder.checks.nb07_admission_control.preemption_report"]._report(engine)

    entry, outcome = recorded(exercise, preemption_report_through_the_check)
    assert outcome is not None and REFERENCE_MESSAGE in outcome and "_report" in outcome, outcome
    ok, message = replay(get_check(exercise.adapter), entry)
    assert not ok and message == f"AssertionError: {outcome}", message
