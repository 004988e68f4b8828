"""What the per-notebook check tests (tests/test_checks_nbXX.py) share: a check's verdict on one
implementation and seed (its run time printed: speed is shown, never asserted), an exercise's
course_lib counterpart from the table of exercises, and (exercise, implementation) cases."""
from __future__ import annotations

import importlib
import time

from autograder.checks import get_check
from autograder.exercises import BY_ADAPTER


def verdict(exercise: str, impl, seed: int) -> str | None:
    """None if `impl` passes check_<exercise> on `seed`, else the check's message."""
    start = time.perf_counter()
    try:
        get_check(exercise)(impl, seed, _allow_reference=True)
        message = None
    except AssertionError as e:
        message = str(e)
    print(f"check_{exercise}({getattr(impl, '__name__', impl)}, seed={seed}): {time.perf_counter() - start:.2f} s")
    return message


def counterpart(exercise: str):
    """The course_lib piece the table names as doing the exercise's job."""
    module, _, name = BY_ADAPTER[exercise].counterpart.partition(":")
    return getattr(importlib.import_module(module), name)


def cases(exercises, table: dict) -> list[tuple]:
    """(exercise, implementation) for every implementation `table` lists for these exercises."""
    return [(ex, impl) for ex in exercises for impl in table[ex]]
