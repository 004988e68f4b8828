"""The autograder's checks behave like trustworthy tests: handing in course_lib's piece or the
answer key gets no credit (however disguised), checks are deterministic and side-effect free, and
unfinished or crashing work is named precisely.

That the reference passes and every mutant fails on every graded seed, and every control passes,
is tested from the table of exercises (tests/test_exercise_table.py); what is particular to one
notebook's checks, in tests/test_checks_nbXX.py.
"""
from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest
import torch

from autograder._checking import AUTOGRADER_REFERENCE_MESSAGE, REFERENCE_MESSAGE
from autograder.checks import CHECKS, MODULES, get_check
from autograder.exercises import BY_ADAPTER
from autograder.mutants import E2E, REGISTRY

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted(CHECKS)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_of(exercise):
    return getattr(importlib.import_module(f"autograder.reference.{CHECKS[exercise]}"), exercise)


def course_lib_stand_in(exercise):
    """Something from course_lib handed in for an exercise: the table's counterpart, or (where it has
    none) some other course_lib function."""
    counterpart = BY_ADAPTER[exercise].counterpart or "course_lib.sim.metrics:summarize"
    module, _, name = counterpart.partition(":")
    return getattr(importlib.import_module(module), name)


def fails(check, impl, seed=0):
    try:
        check(impl, seed, _allow_reference=True)
    except AssertionError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------------------------
# The generated references and the mutants stand alone
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", ["reference", "mutants"])
def test_solutions_and_mutants_paste_into_a_notebook(package):
    """Their modules import nothing from the autograder, so their source runs in a notebook cell."""
    for name in MODULES:
        path = ROOT / "autograder" / package / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0 and not (node.module or "").startswith("autograder"), f"{path}: {ast.dump(node)}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("autograder") for a in node.names), path


# ---------------------------------------------------------------------------------------------
# Handing in the reference gets no credit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exercise", EXERCISES)
def test_handing_in_course_lib_is_refused(exercise):
    with pytest.raises(AssertionError, match=re.escape(REFERENCE_MESSAGE)):
        get_check(exercise)(course_lib_stand_in(exercise))


@pytest.mark.parametrize("exercise", EXERCISES)
def test_handing_in_the_autograder_reference_is_refused(exercise):
    with pytest.raises(AssertionError, match=re.escape(AUTOGRADER_REFERENCE_MESSAGE)):
        get_check(exercise)(reference_of(exercise))


def test_disguised_references_are_refused():
    from course_lib.attention.reference import paged_decode_reference
    from course_lib.kv.block_pool import BlockPool
    from course_lib.scheduler.admission import WatermarkAdmission
    from course_lib.scheduler.base import SchedulerBase
    from course_lib.scheduler.continuous import ContinuousScheduler

    check_pool = get_check("StudentBlockPool")
    cases = [
        (check_pool, type("Subclass", (BlockPool,), {})),
        (check_pool, type("Copied", (), {k: v for k, v in vars(BlockPool).items() if not k.startswith("__")} | {
            "__init__": BlockPool.__init__})),
        (get_check("paged_attention_loops"), functools.partial(paged_decode_reference)),
        (get_check("StudentWatermark"), type("W", (WatermarkAdmission,), {})),
    ]

    def wrapper(q, k, v, bt, lens, scale):  # defined here: only the call reveals it
        from course_lib.attention import paged_decode

        return paged_decode(q, k, v, bt, lens, scale, backend="reference")

    class Delegating(SchedulerBase):
        def schedule(self):
            return ContinuousScheduler.schedule(self)

        def finish(self, request):
            return ContinuousScheduler.finish(self, request)

    cases += [(get_check("paged_attention_loops"), wrapper), (get_check("StudentScheduler"), Delegating)]
    for check, impl in cases:
        with pytest.raises(AssertionError, match=re.escape(REFERENCE_MESSAGE)):
            check(impl)


# ---------------------------------------------------------------------------------------------
# Mutants (each fails on every graded seed: tests/test_exercise_table.py)
# ---------------------------------------------------------------------------------------------


def test_the_end_to_end_mutants_exist():
    for module, (exercise, name) in E2E.items():
        assert CHECKS[exercise] == module
        assert any(m.__name__ == name for m in REGISTRY[exercise])


# ---------------------------------------------------------------------------------------------
# Checks behave like tests: deterministic, side-effect free, precise about unfinished work
# ---------------------------------------------------------------------------------------------


def test_checks_are_deterministic_and_leave_global_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    for exercise in ("StudentBlockPool", "static_generate"):
        mutant = REGISTRY[exercise][0]
        assert fails(get_check(exercise), mutant, 5) == fails(get_check(exercise), mutant, 5)
        get_check(exercise)(reference_of(exercise), 5, _allow_reference=True)
    assert torch.equal(torch.rand(3), expected), "a check changed the caller's torch RNG state"
    assert torch.get_num_threads() == threads


def test_unfinished_exercise_raises_not_implemented():
    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        get_check("pad_batch")(unfinished)
    with pytest.raises(AssertionError, match="is None"):
        get_check("pad_batch")(None)


def test_a_crash_in_student_code_names_the_line():
    def crashes(prompts, pad_id):
        return prompts[99]

    with pytest.raises(AssertionError, match=r"raised IndexError.*your code: crashes"):
        get_check("pad_batch")(crashes)
