"""The autograder's checks are trustworthy: the reference passes every check, every known-buggy
implementation fails one, every check catches one, and handing in the reference gets no credit.

A check that cannot fail is a defect; so is a check that fails a correct solution.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

from autograder import mutants as mutants_pkg
from autograder import reference as reference_pkg
from autograder._checking import AUTOGRADER_REFERENCE_MESSAGE, REFERENCE_MESSAGE
from autograder.checks import CHECKS, MODULES, get_check
from autograder.mutants import E2E, REGISTRY

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted(CHECKS)
ALL_MUTANTS = [(ex, m) for ex in EXERCISES for m in REGISTRY.get(ex, [])]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_of(exercise):
    return getattr(importlib.import_module(f"autograder.reference.{CHECKS[exercise]}"), exercise)


def course_lib_reference(exercise):
    """course_lib's own implementation of an exercise, where one has the adapter's shape."""
    if exercise == "StudentScheduler":
        from course_lib.scheduler.continuous import ContinuousScheduler as impl
    elif exercise == "StudentBlockPool":
        from course_lib.kv.block_pool import BlockPool as impl
    elif exercise == "paged_attention_loops":
        from course_lib.attention.reference import paged_decode_reference as impl
    elif exercise == "paged_attention_vectorized":
        from course_lib.attention.torch_paged import paged_decode_torch as impl
    elif exercise == "StudentPrefixCache":
        from course_lib.kv.prefix_cache import PrefixCache as impl
    elif exercise == "StudentWatermark":
        from course_lib.scheduler.admission import WatermarkAdmission as impl
    elif exercise == "build_flat_batch":
        from course_lib.runner_batch import build_flat_batch as impl
    else:
        return None
    return impl


def course_lib_stand_in(exercise):
    """Something from course_lib handed in for an exercise: its reference, or a course_lib function."""
    impl = course_lib_reference(exercise)
    if impl is not None:
        return impl
    from course_lib.kv.page_table import PageTable
    from course_lib.sim import metrics

    return {
        "kv_bytes_per_token": metrics.prefix_hit_rate,
        "answer": importlib.import_module("course_lib.cli.generate").main,
        "pad_batch": metrics.percentiles,
        "padding_waste": metrics.kv_waste_frac,
        "static_generate": importlib.import_module("course_lib.model.transformer").Transformer.generate,
        "mean_batch_occupancy": metrics.mean_kv_util,
        "slot_mapping": PageTable.slots,
        "paged_waste": metrics.kv_waste_frac,
        "contiguous_waste": metrics.kv_waste_frac,
        "latency_summary": metrics.summarize,
        "run_closed_loop": importlib.import_module("course_lib.sim.workload").ClosedLoopUsers,
        "page_keys": metrics.prefix_hit_rate,
        "preemption_report": metrics.summarize,
    }[exercise]


def fails(check, impl, seed=0):
    try:
        check(impl, seed, _allow_reference=True)
    except AssertionError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------------------------
# The contract: exercises.md <-> checks <-> references <-> mutants
# ---------------------------------------------------------------------------------------------


def test_every_exercise_of_the_spec_has_a_check_a_reference_and_mutants():
    spec = (ROOT / "docs" / "exercises.md").read_text()
    adapters = set()
    for row in spec.splitlines():
        cells = [c.strip() for c in row.split("|")]
        if len(cells) > 5 and cells[1].isdigit():
            # a cell names a class (its methods follow), or one function, or two joined by "and"
            names = re.findall(r"(?:^|\band )`(class )?([A-Za-z_]\w*)\(", cells[4])
            adapters.update([names[0][1]] if names[0][0] else [n for _, n in names])
    assert adapters == set(CHECKS), f"spec adapters {sorted(adapters)} vs checks {sorted(CHECKS)}"
    for exercise, module in CHECKS.items():
        check = get_check(exercise)
        assert check.__name__ == f"check_{exercise}" and check.exercise == exercise
        assert list(inspect.signature(check).parameters)[:2] == ["impl", "seed"]
        assert callable(reference_of(exercise))
        assert len(REGISTRY.get(exercise, [])) >= 3, f"{exercise} needs several mutants"
    assert sorted(MODULES) == sorted(set(CHECKS.values())) == sorted(reference_pkg.MODULES) == sorted(mutants_pkg.MODULES)


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
# The reference passes; course_lib's own implementations agree with the checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("exercise", EXERCISES)
def test_reference_passes(exercise, seed):
    check = get_check(exercise)
    assert check(reference_of(exercise), seed, _allow_reference=True) is None  # a value would be partial credit


@pytest.mark.parametrize("exercise", [e for e in EXERCISES if course_lib_reference(e) is not None])
def test_course_lib_itself_passes(exercise):
    get_check(exercise)(course_lib_reference(exercise), 3, _allow_reference=True)


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
# Mutants: each fails its exercise's check (whatever the seed); each check fails some mutant
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exercise, mutant", ALL_MUTANTS, ids=[f"{e}-{m.__name__}" for e, m in ALL_MUTANTS])
def test_every_mutant_fails_its_check(exercise, mutant):
    check = get_check(exercise)
    for seed in (0, 7):
        message = fails(check, mutant, seed)
        assert message, f"{mutant.__name__} ({inspect.getdoc(mutant)}) passed check_{exercise} with seed {seed}"
        assert len(message) > 40, f"unhelpful message: {message!r}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_check_fails_some_mutant(exercise):
    check = get_check(exercise)
    assert any(fails(check, m) for m in REGISTRY[exercise]), f"check_{exercise} cannot fail"


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
