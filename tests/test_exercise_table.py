"""The one table of exercises (autograder/exercises.py) agrees with everything built from it:
the notebooks' graded cells and points, the checks, the generated references, the hand-written
mutants (each fails on every graded seed: no seed luck) and the controls (correct solutions
written differently: each passes on every graded seed: no false alarms)."""
from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.checks import get_check
from autograder.exercises import EXERCISES
from autograder.hidden_seeds import cell_seeds

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cells(exercise):
    path = ROOT / "solutions" / exercise.assignment / f"{exercise.assignment}.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    return {(c["metadata"].get("nbgrader") or {}).get("grade_id"): c for c in nb["cells"]}


def _registry(package):
    out = {}
    for module in sorted({e.module for e in EXERCISES}):
        try:
            mod = importlib.import_module(f"autograder.{package}.{module}")
        except ModuleNotFoundError:
            continue
        for adapter, impls in getattr(mod, package.upper()).items():
            out.setdefault(adapter, []).extend(impls)
    return out


MUTANTS = _registry("mutants")
CONTROLS = _registry("controls")


def test_there_are_at_least_24_graded_exercises():
    assert len(EXERCISES) >= 24, f"{len(EXERCISES)} graded exercises; the course promises at least 24"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_the_notebook_has_the_solution_and_test_cells_with_the_table_points(exercise):
    cells = _cells(exercise)
    defines = re.compile(rf"^(?:def|class) {exercise.adapter}\b", re.M)
    solution = cells.get(exercise.adapter) or next(
        (c for c in cells.values() if (c["metadata"].get("nbgrader") or {}).get("solution")
         and defines.search("".join(c["source"]))), None)  # two adapters may share one solution cell
    assert solution is not None, (f"{exercise.assignment}: no solution cell with grade_id {exercise.adapter!r} "
                                  f"or defining it")
    test = cells.get(exercise.test_cell)
    assert test is not None, f"{exercise.assignment}: no graded test cell {exercise.test_cell!r}"
    sharing = [e for e in EXERCISES if e.module == exercise.module and e.test_cell == exercise.test_cell]
    assert float(test["metadata"]["nbgrader"]["points"]) == sum(e.points for e in sharing)
    source = "".join(test["source"])
    assert f"{exercise.check_name}(" in source, f"{exercise.test_cell} does not call {exercise.check_name}"
    visible, hidden = cell_seeds(source, exercise.adapter)
    assert visible == (exercise.visible_seed,), (f"{exercise.test_cell}: the visible test should call "
                                                 f"{exercise.check_name} with seed={exercise.visible_seed}, not {visible}")
    assert hidden, f"{exercise.test_cell}: its hidden tests should call {exercise.check_name} with other literal seeds"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_the_check_and_the_counterpart_exist(exercise):
    check = get_check(exercise.adapter)
    assert list(inspect.signature(check).parameters)[:2] == ["impl", "seed"]
    if exercise.counterpart:
        module, _, name = exercise.counterpart.partition(":")
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        assert callable(obj)


def test_the_references_are_generated_from_the_solution_cells():
    result = subprocess.run([sys.executable, "scripts/extract_references.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"run python scripts/extract_references.py:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_the_reference_passes_every_graded_seed_and_has_mutants(exercise):
    reference = getattr(importlib.import_module(f"autograder.reference.{exercise.module}"), exercise.adapter)
    check = get_check(exercise.adapter)
    for seed in exercise.graded_seeds:
        assert check(reference, seed, _allow_reference=True) is None, f"seed {seed}"  # a value would be partial credit
    assert len(MUTANTS.get(exercise.adapter, [])) >= 3, f"{exercise.adapter}: write at least 3 realistic mutants"


MUTANT_CASES = [(e, m) for e in EXERCISES for m in MUTANTS.get(e.adapter, [])]
CONTROL_CASES = [(e, c) for e in EXERCISES for c in CONTROLS.get(e.adapter, [])]


@pytest.mark.parametrize("exercise, mutant", MUTANT_CASES, ids=[f"{e.adapter}-{m.__name__}" for e, m in MUTANT_CASES])
def test_every_mutant_fails_on_every_graded_seed(exercise, mutant):
    check = get_check(exercise.adapter)
    for seed in exercise.graded_seeds:
        with pytest.raises(AssertionError) as info:
            check(mutant, seed, _allow_reference=True)
        message = str(info.value)
        assert len(message) > 40, f"unhelpful message on seed {seed}: {message}"
        assert "internal" not in message, f"{mutant.__name__} tripped an internal guard, not a rule: {message}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_every_exercise_has_a_control(exercise):
    assert CONTROLS.get(exercise.adapter), (f"{exercise.adapter}: add a correct solution written differently to "
                                            f"autograder/controls/{exercise.module}.py")


@pytest.mark.parametrize("exercise, control", CONTROL_CASES, ids=[f"{e.adapter}-{c.__name__}" for e, c in CONTROL_CASES])
def test_every_control_passes_on_every_graded_seed(exercise, control):
    check = get_check(exercise.adapter)
    for seed in exercise.graded_seeds:
        assert check(control, seed, _allow_reference=True) is None


def test_docs_exercises_md_is_built_from_the_table_and_the_notebook_pages():
    result = subprocess.run([sys.executable, "scripts/build_exercises_doc.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{result.stdout}{result.stderr}"
