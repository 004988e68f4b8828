"""Notebook 06's checks (prefix caching): the generated reference and course_lib's cache pass on
every graded seed (that every mutant fails and every control passes on every graded seed is tested for
all notebooks in tests/test_exercise_table.py). Run times are printed (no timed assertion: speed is not a test)."""
from __future__ import annotations

import pytest

from autograder.controls import nb06_prefix_caching as controls
from autograder.exercises import of_module
from autograder.mutants import nb06_prefix_caching as mutants
from autograder.reference import nb06_prefix_caching as reference
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb06_prefix_caching")}


def test_every_exercise_has_mutants_and_controls():
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_passes_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None


def test_course_lib_cache_passes():
    from course_lib.kv.prefix_cache import PrefixCache

    for seed in EXERCISES["StudentPrefixCache"].graded_seeds:
        assert verdict("StudentPrefixCache", PrefixCache, seed) is None


