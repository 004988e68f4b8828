"""What the per-notebook check tests (tests/test_checks_nbXX.py) share: a check's verdict on one
implementation and seed (its run time printed: speed is shown, never asserted), an exercise's
course_lib counterpart from the table of exercises, (exercise, implementation) cases, and one check call
recorded as the sandbox records it."""
from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
import time
from pathlib import Path

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


def record_check_call(path, adapter: str, impl) -> tuple[dict, str | None]:
    """(the record entry of one call of `adapter`'s check on its visible seed, written to `path` as the
    sandbox writes it; the kernel's outcome: None if it passed, else the AssertionError's message)."""
    from autograder import record
    from autograder.replay import read_records

    record.start(str(path))
    try:
        get_check(adapter)(impl, seed=BY_ADAPTER[adapter].visible_seed)
        outcome = None
    except AssertionError as exc:
        outcome = str(exc)
    finally:
        record.SESSION = None
    entries, problems = read_records(path)
    assert not problems and len(entries) == 1, problems
    return entries[0], outcome


def counterpart(exercise: str):
    """The course_lib piece the table names as doing the exercise's job."""
    module, _, name = BY_ADAPTER[exercise].counterpart.partition(":")
    return getattr(importlib.import_module(module), name)


def cases(exercises, table: dict) -> list[tuple]:
    """(exercise, implementation) for every implementation `table` lists for these exercises."""
    return [(ex, impl) for ex in exercises for impl in table[ex]]


def student_module_loader(folder: Path, prefix: str):
    """`load(kind, module)`: autograder/<kind>/<module>.py imported from a copy in `folder`, as a
    student's module (its functions' files are the student's, not the grader's); `load.forget()`
    drops them from sys.modules."""
    root = Path(__file__).resolve().parents[1] / "autograder"
    loaded = {}

    def load(kind, module):
        name = f"{prefix}_{kind}_{module}"
        if name not in loaded:
            path = folder / f"{name}.py"
            shutil.copy(root / kind / f"{module}.py", path)
            spec = importlib.util.spec_from_file_location(name, path)
            loaded[name] = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded[name]
            spec.loader.exec_module(loaded[name])
        return loaded[name]

    def forget():
        for name in loaded:
            sys.modules.pop(name, None)

    load.forget = forget
    return load


def student_copy_fixture(prefix: str):
    """A module-scoped pytest fixture `student_copy(kind, module)`: autograder/<kind>/<module>.py
    imported from a copy, as a student's module (the record/replay tests' submissions)."""
    import pytest

    @pytest.fixture(scope="module")
    def student_copy(tmp_path_factory):
        load = student_module_loader(tmp_path_factory.mktemp("submission"), prefix)
        yield load
        load.forget()

    return student_copy
