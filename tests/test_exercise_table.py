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


# ---------------------------------------------------------------------------------------------
# What is generated from the table (scripts/regenerate.py runs every generator)
# ---------------------------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "scripts"))
import build_grading_tables  # noqa: E402  (scripts/)
import regenerate  # noqa: E402  (scripts/)


def test_docs_grading_md_tables_are_built_from_the_table():
    result = subprocess.run([sys.executable, "scripts/build_grading_tables.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{result.stdout}{result.stderr}"


def test_a_stale_or_missing_block_of_docs_grading_md_is_named(tmp_path):
    doc = (ROOT / "docs" / "grading.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `nb03_paged_kv` | `check_"))
    stale = tmp_path / "stale.md"
    stale.write_text(doc.replace(row + "\n", ""), encoding="utf-8")  # a check table that lost a notebook
    script = [sys.executable, "scripts/build_grading_tables.py", "--check", "--doc"]
    done = subprocess.run(script + [str(stale)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and "out of date in: check-table:" in done.stdout, done.stdout + done.stderr
    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text(doc.replace(build_grading_tables.end_marker("definitions"), ""), encoding="utf-8")
    done = subprocess.run(script + [str(unmarked)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and "definitions: expected one" in done.stdout, done.stdout + done.stderr
    fixed = subprocess.run(script[:2] + ["--doc", str(stale)], cwd=ROOT, capture_output=True, text=True)
    assert fixed.returncode == 0 and stale.read_text(encoding="utf-8") == doc, fixed.stdout + fixed.stderr


def test_every_exercise_has_a_row_in_the_mutation_report():
    rows = build_grading_tables.load_report()["rows"]
    adapters = [e.adapter for e in EXERCISES]
    missing = [a for a in adapters if a not in rows]
    assert not missing, (f"no mutation testing results for {missing}: run python -m autograder mutate "
                         f"{' '.join('--exercise ' + a for a in missing)} --json m.json, then python "
                         "scripts/build_grading_tables.py --mutation-json m.json --machine TEXT")
    assert not set(rows) - set(adapters), f"docs/mutation_report.json has rows of removed exercises: {set(rows) - set(adapters)}"


def test_a_merged_mutate_report_replaces_its_exercises_rows_and_is_shown_as_its_own_run():
    report = build_grading_tables.load_report()
    run = {"date": "2027-01-02 03:04", "seconds": 12.5, "jobs": 1, "summary": [
        {"exercise": "slot_mapping", "module": "nb03_paged_kv", "generated": 60, "killed": 59, "survived": 1,
         "equivalent": 0, "kill_rate": 59 / 60}]}
    merged = build_grading_tables.merge(report, run, "a test machine")
    last = len(merged["runs"]) - 1  # the new run, after every run some other row still refers to
    assert merged["rows"]["slot_mapping"] == {"generated": 60, "killed": 59, "survived": 1, "equivalent": 0, "run": last}
    assert merged["runs"][last]["machine"] == "a test machine"
    assert list(merged["rows"]) == [e.adapter for e in EXERCISES]
    assert sorted({row["run"] for row in merged["rows"].values()}) == list(range(len(merged["runs"]))), "unused runs stay"
    table = build_grading_tables.mutation_table(merged)
    assert table.startswith(f"Merged from {len(merged['runs'])} runs") and "a test machine" in table
    assert "| `slot_mapping` | 60 | 59 | 1 | 0 | 98.3% |" in table
    assert report == build_grading_tables.load_report(), "merge must not change the report it is given"
    with pytest.raises(SystemExit, match="not in autograder/exercises.py"):
        build_grading_tables.merge(report, dict(run, summary=[dict(run["summary"][0], exercise="nope")]), "m")


def test_a_wrapped_definition_never_starts_a_line_like_a_list():
    text = "x" * 101 + " - 1 gaps and `a code span that stays on one line` " + "y " * 60
    item = build_grading_tables.list_item(text)
    assert all(not line.lstrip().startswith("- ") for line in item.splitlines()[1:]), item
    assert "`a code span that stays on one line`" in item


def test_regenerate_check_passes_on_the_repository():
    """Every generator in its --check mode (about 8-12 s: nbgrader regenerates the eight notebooks)."""
    done = subprocess.run([sys.executable, "scripts/regenerate.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [g.script for g in regenerate.GENERATORS] == ["generate_notebooks.py", "extract_references.py",
                                                         "build_exercises_doc.py", "build_grading_tables.py"]


def test_regenerate_names_what_is_stale_and_stops_writing_at_a_failure(tmp_path, capsys):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "stale.py").write_text("import sys\nprint('out of date: thing.txt')\nsys.exit(1)\n")
    (scripts / "after.py").write_text("import pathlib, sys\npathlib.Path(sys.argv[0]).with_name('ran').touch()\n")
    generators = [regenerate.Generator("stale.py", "thing.txt"), regenerate.Generator("after.py", "other.txt")]
    problems = regenerate.run(generators, check=True, root=tmp_path)
    assert len(problems) == 1 and "thing.txt" in problems[0] and "out of date: thing.txt" in problems[0], problems
    assert (scripts / "ran").exists(), "--check runs every generator"
    (scripts / "ran").unlink()
    problems = regenerate.run(generators, check=False, root=tmp_path)
    assert len(problems) == 1 and "stale.py failed" in problems[0], problems
    assert not (scripts / "ran").exists(), "a generator after a failing one must not run (it may read its output)"
