"""Notebook 00's checks (setup): the generated reference and course_lib's counterparts pass on every
graded seed (that every mutant fails and every control passes on every graded seed, with a message
naming the rule, is tested for all notebooks in tests/test_exercise_table.py). Run times are printed
(no timed assertion: speed is not a test)."""
from __future__ import annotations

import pytest

from autograder.checks import get_check
from autograder.controls import nb00_setup as controls
from autograder.exercises import of_module
from autograder.mutants import nb00_setup as mutants
from autograder.reference import nb00_setup as reference
from check_support import counterpart, verdict

EXERCISES = {e.adapter: e for e in of_module("nb00_setup")}


def test_every_exercise_has_mutants_and_controls():
    assert set(EXERCISES) == {"kv_bytes_per_token", "answer"}
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None
        assert verdict(exercise, counterpart(exercise), seed) is None


def test_an_answer_that_wraps_course_lib_is_refused():
    from course_lib.cli.generate import answer as course_answer

    def wrapper(model, tokenizer, prompt, max_tokens=64):
        return course_answer(model, tokenizer, prompt, max_tokens)

    for impl in (course_answer, wrapper):
        with pytest.raises(AssertionError, match="course_lib's reference"):
            get_check("answer")(impl)


def test_answer_reuse_mutant_fails_on_a_fresh_start():
    """The engine-reusing mutant keeps module state: reset it, so seed 0 alone must catch it."""
    mutants._FIRST_ENGINE.clear()
    message = verdict("answer", mutants.answer_reuses_first_engine, 0)
    assert message and "another_model" in message, message
