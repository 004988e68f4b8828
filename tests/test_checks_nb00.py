"""Notebook 00's checks (setup): the generated reference and course_lib's counterparts pass on every
graded seed (that every mutant fails and every control passes on every graded seed, with a message
naming the rule, is tested for all notebooks in tests/test_exercise_table.py). Run times are printed
(no timed assertion: speed is not a test)."""
from __future__ import annotations

import importlib
import time

import pytest
import torch

from autograder.checks import get_check
from autograder.controls import nb00_setup as controls
from autograder.exercises import of_module
from autograder.mutants import nb00_setup as mutants
from autograder.reference import nb00_setup as reference

EXERCISES = {e.adapter: e for e in of_module("nb00_setup")}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def _counterpart(exercise):
    module, _, name = EXERCISES[exercise].counterpart.partition(":")
    return getattr(importlib.import_module(module), name)


def test_every_exercise_has_mutants_and_controls():
    assert set(EXERCISES) == {"kv_bytes_per_token", "answer"}
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert _verdict(exercise, getattr(reference, exercise), seed) is None
        assert _verdict(exercise, _counterpart(exercise), seed) is None


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
    message = _verdict("answer", mutants.answer_reuses_first_engine, 0)
    assert message and "another_model" in message, message
