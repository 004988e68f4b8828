"""The grading command: restores what students may not change, survives what students do to a
kernel, refuses tampering, and agrees with itself; the nbgrader demo works; and the course's own
notebooks round-trip (solutions full marks, released notebooks 0, a planted bug costs its marks).

Unit tests use tiny hand-made notebooks written to tmp_path. The round trip at the end grades the
real notebooks of solutions/ and notebooks/ (it fails, rather than skips, if solutions/ exists
but holds none).
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder import grade as G
from autograder.submissions import mutant_for, perfect_submission, plant_mutant, graded_cells_calling

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 10  # seconds per cell for the tiny notebooks: the infinite loops hit it; a check on a busy
# 2-core machine (several graders at once) can take more than 4 s


# ---------------------------------------------------------------------------------------------
# A tiny assignment
# ---------------------------------------------------------------------------------------------


def _meta(gid, *, solution=False, grade=False, locked=False, points=0):
    m = {"grade": grade, "grade_id": gid, "locked": locked, "schema_version": 3, "solution": solution, "task": False}
    if grade:
        m["points"] = points
    return {"nbgrader": m}


def tiny_source():
    cells = [
        new_markdown_cell("# A tiny assignment", metadata=_meta("intro", locked=True)),
        new_code_cell("import math", metadata=_meta("imports", locked=True)),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                      metadata=_meta("double_sol", solution=True)),
        new_code_cell('assert double(2) == 4, "double(2) should be 4"\n### BEGIN HIDDEN TESTS\n'
                      'assert double(5) == 10, "hidden: double(5) should be 10"\n### END HIDDEN TESTS',
                      metadata=_meta("test_double", grade=True, locked=True, points=2)),
        new_code_cell("def kv_bytes_per_token(config, bytes_per_elem):\n    ### BEGIN SOLUTION\n"
                      "    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem\n"
                      "    ### END SOLUTION", metadata=_meta("kv_sol", solution=True)),
        new_code_cell("from autograder.checks.nb00_setup import check_kv_bytes_per_token\n"
                      "check_kv_bytes_per_token(kv_bytes_per_token)\n### BEGIN HIDDEN TESTS\n"
                      "check_kv_bytes_per_token(kv_bytes_per_token, seed=1)\n### END HIDDEN TESTS",
                      metadata=_meta("test_kv", grade=True, locked=True, points=3)),
        new_code_cell("def slot_mapping(block_table, page_size, start, count):\n    ### BEGIN SOLUTION\n"
                      "    return [block_table[p // page_size] * page_size + p % page_size for p in range(start, start + count)]\n"
                      "    ### END SOLUTION", metadata=_meta("slots_sol", solution=True)),
        new_code_cell("from autograder.checks.nb03_paged_kv import check_slot_mapping\ncheck_slot_mapping(slot_mapping)",
                      metadata=_meta("test_slots", grade=True, locked=True, points=2)),
        new_code_cell("def spin():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                      metadata=_meta("spin_sol", solution=True)),
        new_code_cell("assert spin() == 1", metadata=_meta("test_spin", grade=True, locked=True, points=1)),
        new_code_cell("print('teaching cell after the exercises')"),
        new_code_cell("assert math.sqrt(4) == 2 and slot_mapping([3], 4, 0, 1) == [12]",
                      metadata=_meta("test_last", grade=True, locked=True, points=1)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


MAX = 9.0


def released(source):
    nb = copy.deepcopy(source)
    for cell in nb.cells:
        cell.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", cell.source, flags=re.S)
        if G._nbg(cell).get("solution"):
            cell.source = cell.source.split("\n")[0] + "\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    return nb


def answer(nb, gid, code):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if G.grade_id(cell) == gid:
            cell.source = code
    return nb


def scores(entry):
    return {c["grade_id"]: c["score"] for c in entry["cells"]}


def feedback(entry, gid):
    return next(c["feedback"] for c in entry["cells"] if c["grade_id"] == gid)


# ---------------------------------------------------------------------------------------------
# Without a kernel
# ---------------------------------------------------------------------------------------------


def test_assemble_restores_tests_and_keeps_answers():
    source = tiny_source()
    sub = released(source)
    sub = answer(sub, "double_sol", "def double(x):\n    return 3 * x")
    sub = answer(sub, "test_double", "pass  # the student 'fixed' the test")
    sub.cells = [c for c in sub.cells if G.grade_id(c) != "test_spin"]  # deleted
    for cell in sub.cells:
        if G.grade_id(cell) == "test_kv":
            cell.metadata["nbgrader"]["points"] = 1000  # inflated points
    sub.cells.append(new_code_cell("x = 1", metadata=_meta("forged", grade=True, points=50)))
    nb, notes = G.assemble(sub, source)
    by_id = {G.grade_id(c): c for c in nb.cells if G.grade_id(c)}
    assert "hidden: double(5)" in by_id["test_double"].source, "hidden tests must be put back"
    assert by_id["double_sol"].source == "def double(x):\n    return 3 * x", "the answer is the student's"
    assert by_id["test_kv"].metadata["nbgrader"]["points"] == 3
    assert "forged" not in by_id and nb.cells[-1].source == "x = 1"
    ids = [G.grade_id(c) for c in nb.cells]
    assert ids.index("test_spin") == ids.index("spin_sol") + 1, "a deleted test goes back where it was"
    assert any("deleted" in n for n in notes) and any("edited" in n for n in notes)
    assert not any("test_last" in n for n in notes), "an untouched released test is not 'edited'"


def test_find_source(tmp_path):
    for rel in ("03_paged_kv/03_paged_kv.ipynb", "05_hundred_users/05_hundred_users.ipynb"):
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_text("{}")
    index = G.source_index(tmp_path)
    assert G.find_source(Path("sub/alice/03_paged_kv/03_paged_kv.ipynb"), index).name == "03_paged_kv.ipynb"
    # the folder names the assignment: a file's name alone, or a name it contains, does not
    # (tests/test_batch_paths.py has the rest)
    assert G.find_source(Path("inbox/05_hundred_users.ipynb"), index) is None
    assert G.find_source(Path("inbox/alice_03_paged_kv_final.ipynb"), index) is None
    assert G.find_source(Path("inbox/unrelated.ipynb"), index) is None


def test_scan_source_flags_tampering_but_not_ordinary_code():
    bad = {
        "import autograder.checks.nb03_paged_kv as c\nc.check_x = lambda *a: None": "autograder",
        "import builtins\nbuiltins.AssertionError = Exception": "builtins",
        "import sys\nsys.modules['x'] = None": "sys.modules",
        "import sys as _s\nm = _s.modules['x']": "sys.modules under another name",
        "import importlib": "importlib",
        "f.__code__ = g.__code__": "__code__",
        "from course_lib.kv.block_pool import BlockPool\nBlockPool.allocate = lambda self, n: []": "course_lib",
        "import course_lib.kv.block_pool as bp\nsetattr(bp.BlockPool, 'free', None)": "course_lib",
        "get_ipython().run_cell = None": "IPython",
    }
    for code, why in bad.items():
        assert G.scan_source(code), f"not flagged ({why}): {code}"
    fine = ("# the autograder checks this\nx = 'builtins'\n%matplotlib inline\nimport torch\n"
            "from course_lib.kv.block_pool import OutOfPages\npool = {}\npool.free = 3\nimport math\n")
    assert G.scan_source(fine) == []


def test_score_cell_follows_nbgrader():
    cell = new_code_cell("check()", metadata=_meta("t", grade=True, points=2))
    marker = "[autograder] t ok TOKEN\n"
    ok = nbformat.v4.new_output("stream", name="stdout", text=marker)
    cell.outputs = [ok]
    assert G.score_cell(cell, "ok", "TOKEN") == (2.0, "passed", "")
    cell.outputs = [ok, nbformat.v4.new_output("stream", name="stderr", text="UserWarning: careful\n")]
    assert G.score_cell(cell, "ok", "TOKEN")[0] == 0
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="forged marker\n")]
    assert G.score_cell(cell, "ok", "TOKEN")[1] == "integrity"
    cell.outputs = [ok, nbformat.v4.new_output("execute_result", data={"text/plain": "1.5"}, execution_count=1)]
    assert G.score_cell(cell, "ok", "TOKEN")[0] == 1.5
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="page 7 is still used",
                                           traceback=[])]
    assert G.score_cell(cell, "error", "TOKEN") == (0.0, "failed", "AssertionError: page 7 is still used")


def test_guard_injection_round_trips():
    nb = tiny_source()
    original = [c.source for c in nb.cells]
    tokens = G.inject_guard(nb, "__autograder_test__")
    assert nb.cells[0].metadata["autograder"]["setup"] and set(tokens) == {
        "test_double", "test_kv", "test_slots", "test_spin", "test_last"}
    wrapped = next(c for c in nb.cells if G.grade_id(c) == "test_kv")
    assert wrapped.source.startswith("__autograder_test__('test_kv')") and tokens["test_kv"] in wrapped.source
    G._strip_guard(nb, tokens)
    nb.cells = nb.cells[1:]
    assert [c.source for c in nb.cells] == original


def test_command_line_interface():
    out = subprocess.run([sys.executable, "-m", "autograder", "grade", "--help"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0
    for flag in ("--json", "--timeout", "--source-dir", "--html"):
        assert flag in out.stdout


# ---------------------------------------------------------------------------------------------
# With kernels: every scenario graded in one batch (two at a time)
# ---------------------------------------------------------------------------------------------

SCENARIOS = {
    "perfect": lambda s: perfect_submission(s, released(s)),
    "perfect_again": lambda s: perfect_submission(s, released(s)),
    "released": released,
    "unfinished_one": lambda s: answer(perfect_submission(s), "double_sol", "def double(x):\n    raise NotImplementedError()"),
    "infinite_loop": lambda s: answer(perfect_submission(s), "spin_sol", "def spin():\n    while True:\n        pass"),
    "stubborn_loop": lambda s: answer(perfect_submission(s), "spin_sol",
                                      "def spin():\n    while True:\n        try:\n            while True:\n                pass\n"
                                      "        except KeyboardInterrupt:\n            pass"),
    "crash": lambda s: answer(perfect_submission(s), "double_sol", "def double(x):\n    import os\n    os._exit(1)"),
    "edits_tests": lambda s: answer(answer(perfect_submission(s), "test_double", "pass"), "double_sol",
                                    "def double(x):\n    return 3 * x"),
    "deletes_tests": lambda s: _without(answer(perfect_submission(s), "double_sol", "def double(x):\n    return 3 * x"),
                                        "test_double"),
    "patches_check": lambda s: answer(perfect_submission(s), "kv_sol",
                                      "def kv_bytes_per_token(config, b):\n    return 1\n"
                                      "m = __import__('auto' + 'grader.checks.nb00_setup', fromlist=['x'])\n"
                                      "setattr(m, 'check_kv_bytes_per_token', lambda *a, **k: None)"),
    "patches_check_visibly": lambda s: answer(perfect_submission(s), "kv_sol",
                                              "import autograder.checks.nb00_setup as c\n"
                                              "c.check_kv_bytes_per_token = lambda *a, **k: None\n"
                                              "def kv_bytes_per_token(config, b):\n    return 1"),
    "replaces_assertionerror": lambda s: answer(perfect_submission(s), "kv_sol",
                                                "def kv_bytes_per_token(config, b):\n    return 1\n"
                                                "__import__('buil' + 'tins').AssertionError = type('AssertionError', (Exception,), {})"),
    "rewrites_check_file": lambda s: answer(perfect_submission(s), "kv_sol",
                                            "def kv_bytes_per_token(config, b):\n    return 1\n"
                                            "m = __import__('auto' + 'grader.checks.nb00_setup', fromlist=['x'])\n"
                                            "open(m.__file__, 'w').write('def check_kv_bytes_per_token(*a, **k):\\n    pass\\n')"),
    "hands_in_course_lib": lambda s: answer(perfect_submission(s), "slots_sol",
                                            "from course_lib.kv.page_table import PageTable\n"
                                            "def slot_mapping(block_table, page_size, start, count):\n"
                                            "    table = PageTable(page_size)\n    table.pages = list(block_table)\n"
                                            "    return table.slots(start, count)"),
}


def _without(nb, gid):
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if G.grade_id(c) != gid]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    source = tiny_source()
    (base / "source" / "tiny").mkdir(parents=True)
    nbformat.write(source, base / "source" / "tiny" / "tiny.ipynb")
    paths = []
    for name, build in SCENARIOS.items():
        folder = base / "submitted" / name / "tiny"
        folder.mkdir(parents=True)
        nbformat.write(build(source), folder / "tiny.ipynb")
        paths.append(folder / "tiny.ipynb")
    garbage = base / "submitted" / "garbage" / "tiny" / "tiny.ipynb"
    garbage.parent.mkdir(parents=True)
    garbage.write_text("this is not a notebook")
    orphan = base / "submitted" / "orphan" / "lost.ipynb"
    orphan.parent.mkdir(parents=True)
    nbformat.write(new_notebook(), orphan)
    check_file = (ROOT / "autograder" / "checks" / "nb00_setup" / "kv_bytes_per_token.py").read_bytes()
    out = base / "grades.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", *map(str, paths), str(garbage), str(orphan),
                           "--json", str(out), "--source-dir", str(base / "source"), "--timeout", str(TIMEOUT),
                           "--html", str(base / "html"), "--jobs", "2"], capture_output=True, text=True, cwd=base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (ROOT / "autograder" / "checks" / "nb00_setup" / "kv_bytes_per_token.py").read_bytes() == check_file, \
        "the grader must never write to the repository's files"
    result = json.loads(out.read_text())
    by_name = {Path(nb["path"]).parent.parent.name: nb for nb in result["notebooks"]}
    return result, by_name, base


def test_json_contract(graded):
    result, by_name, _ = graded
    assert set(result) >= {"score", "max_score", "notebooks"}
    assert result["score"] == sum(nb["score"] for nb in result["notebooks"])
    for nb in result["notebooks"]:
        assert set(nb) >= {"path", "score", "max_score", "cells"}
        for cell in nb["cells"]:
            assert set(cell) >= {"cell_id", "grade_id", "score", "max_score", "passed", "feedback", "message"}


def test_perfect_submission_gets_full_marks_twice(graded):
    _, by_name, base = graded
    for name in ("perfect", "perfect_again"):
        nb = by_name[name]
        assert (nb["score"], nb["max_score"]) == (MAX, MAX), nb
        assert not nb["integrity"] and not nb["errors"]
    assert scores(by_name["perfect"]) == scores(by_name["perfect_again"]), "grading is deterministic"
    page = (base / "html").glob("perfect__tiny__tiny__*.html")
    assert f"Score: {MAX:g} / {MAX:g}" in next(page).read_text()


def test_released_notebook_scores_zero_without_crashing(graded):
    nb = graded[1]["released"]
    assert nb["score"] == 0 and nb["max_score"] == MAX and not nb["errors"]
    assert "not finished yet" in feedback(nb, "test_double")


def test_unfinished_exercise_costs_only_its_cells(graded):
    nb = graded[1]["unfinished_one"]
    assert scores(nb) == {"test_double": 0, "test_kv": 3, "test_slots": 2, "test_spin": 1, "test_last": 1}
    assert "NotImplementedError" in feedback(nb, "test_double")


@pytest.mark.parametrize("name", ["infinite_loop", "stubborn_loop"])
def test_infinite_loop_times_out_its_cell_only(graded, name):
    nb = graded[1][name]
    assert scores(nb) == {"test_double": 2, "test_kv": 3, "test_slots": 2, "test_spin": 0, "test_last": 1}
    assert f"timed out after {TIMEOUT} s" in feedback(nb, "test_spin")


def test_stubborn_loop_gets_a_new_kernel(graded):
    assert any("restarting" in e for e in graded[1]["stubborn_loop"]["errors"])


def test_crashing_kernel_is_reported_and_grading_goes_on(graded):
    result, by_name, _ = graded
    nb = by_name["crash"]
    assert "kernel died" in feedback(nb, "test_double")
    assert scores(nb)["test_kv"] == 3 and scores(nb)["test_slots"] == 2, "later cells run in a new kernel"
    assert any("died" in e for e in nb["errors"])
    assert len(result["notebooks"]) == len(SCENARIOS) + 2, "every other notebook was still graded"


@pytest.mark.parametrize("name", ["edits_tests", "deletes_tests"])
def test_edited_or_deleted_tests_are_restored(graded, name):
    nb = graded[1][name]
    assert scores(nb)["test_double"] == 0 and "double(2) should be 4" in feedback(nb, "test_double")
    assert len(nb["cells"]) == 5 and nb["max_score"] == MAX


@pytest.mark.parametrize("name, reason", [
    # (these two tamper in a cell after the first hidden test: what the guard found there is not named,
    # since which names a student's code replaces could carry what it saw of the hidden inputs)
    ("patches_check", "the guard found changes after a hidden test had run"),
    ("patches_check_visibly", "refers to the autograder"),
    ("replaces_assertionerror", "the guard found changes after a hidden test had run"),
])
def test_tampering_gets_no_credit_and_says_why(graded, name, reason):
    nb = graded[1][name]
    assert nb["score"] == 0, scores(nb)
    assert any(reason in item for item in nb["integrity"]), nb["integrity"]
    assert all(c["status"] == "integrity" and reason in c["feedback"] for c in nb["cells"])


def test_rewriting_a_check_file_fails_on_the_read_only_code(graded):
    """In the sandbox the course's code is mounted read-only: the write fails, nothing changes (the
    fixture checks the repository's file), and the exercise's answer (returns 1) earns nothing."""
    nb = graded[1]["rewrites_check_file"]
    assert nb["sandbox"] == "bwrap"
    assert scores(nb)["test_kv"] == 0 and nb["score"] < MAX


def test_handing_in_course_lib_costs_that_exercise(graded):
    nb = graded[1]["hands_in_course_lib"]
    assert scores(nb) == {"test_double": 2, "test_kv": 3, "test_slots": 0, "test_spin": 1, "test_last": 1}
    assert "uses course_lib's reference implementation instead of your own" in feedback(nb, "test_slots")
    assert not nb["integrity"]


def test_unreadable_and_unmatched_notebooks_are_reported(graded):
    result, _, _ = graded
    garbage = next(nb for nb in result["notebooks"] if "garbage" in nb["path"])
    assert garbage["score"] == 0 and garbage["max_score"] == MAX and "could not read" in garbage["errors"][0]
    orphan = next(nb for nb in result["notebooks"] if "orphan" in nb["path"])
    assert orphan["score"] == 0 and "no source notebook" in orphan["errors"][0]


# ---------------------------------------------------------------------------------------------
# The instructor's nbgrader flow
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_course_runs_real_nbgrader_on_a_tiny_assignment(tmp_path):
    from autograder.demo_course import run_demo

    source = tmp_path / "source"
    (source / "tiny").mkdir(parents=True)
    nbformat.write(tiny_source(), source / "tiny" / "tiny.ipynb")
    lines = []
    result = run_demo(tmp_path / "course", source, timeout=60, echo=lines.append)
    assert result["ok"], result["problems"]
    grades = result["grades"]
    assert grades[("tiny", "perfect")] == (MAX, MAX)
    assert grades[("tiny", "untouched")] == (0.0, MAX)
    assert grades[("tiny", "buggy")][0] == MAX - 3, "the planted kv_bytes_per_token bug costs its 3 points"
    course = tmp_path / "course"
    release = nbformat.read(course / "release" / "tiny" / "tiny.ipynb", as_version=4)
    assert "BEGIN SOLUTION" not in json.dumps(release) and "hidden: double(5)" not in json.dumps(release)
    assert (course / "feedback" / "perfect" / "tiny" / "tiny.html").is_file()
    assert any(line.startswith("OK") for line in lines)


# ---------------------------------------------------------------------------------------------
# The course's own notebooks round-trip
# ---------------------------------------------------------------------------------------------

def _has_graded_cells(path: Path) -> bool:
    return any(G.is_test_cell(c) for c in nbformat.read(path, as_version=4).cells)


# Notebooks with nothing to grade (a demo) are not graded: no score to round-trip.
SOLUTIONS = sorted(p for p in (ROOT / "solutions").glob("*/*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts and _has_graded_cells(p))


# Every solution is graded (it must score full marks); the released and the planted-bug versions of
# these notebooks too: the engine-embedded pieces (02's scheduler, 03's pool and flat batch, 07's
# preemption) and the cheapest (00). COURSE_GRADE_ROUND_TRIP=all grades those of every notebook
# (25 kernels, ~12 minutes on 2 cores: too long for CI beside the rest).
ROUND_TRIP_ALL = os.environ.get("COURSE_GRADE_ROUND_TRIP") == "all"
FULL_ROUND_TRIP = [p for p in SOLUTIONS if ROUND_TRIP_ALL or p.parent.name in (
    "00_setup", "02_continuous_batching", "03_paged_kv", "07_admission_control")]


def test_solutions_exist():
    if (ROOT / "solutions").is_dir():
        assert SOLUTIONS, "solutions/ exists but holds no <assignment>/<name>.ipynb notebook"


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """One grading batch (two kernels at a time): every solution, and the released notebook and the
    solution with its end-to-end mutant planted of each notebook in FULL_ROUND_TRIP."""
    base = tmp_path_factory.mktemp("round-trip")
    kinds, planted = {}, {}
    for src in SOLUTIONS:
        name = src.parent.name
        kinds[src] = ("solution", name)
        if src not in FULL_ROUND_TRIP:
            continue
        rel = ROOT / "notebooks" / name / src.name
        if rel.is_file():
            kinds[rel] = ("released", name)
        source = nbformat.read(src, as_version=4)
        choice = mutant_for(src, source)
        nb = None
        if choice is not None:
            nb = plant_mutant(perfect_submission(source, nbformat.read(rel, as_version=4) if rel.is_file() else None),
                              *choice)
        if nb is not None:
            path = base / "mutant" / name / src.name
            path.parent.mkdir(parents=True)
            nbformat.write(nb, path)
            kinds[path] = ("mutant", name)
            planted[name] = (choice[0], graded_cells_calling(source, choice[0]))
    graded = G.grade(list(kinds), source_dir=ROOT / "solutions", timeout=120, jobs=2) if kinds else {"notebooks": []}
    results = {"solution": {}, "released": {}, "mutant": {}}
    for nb in graded["notebooks"]:
        kind, name = kinds[Path(nb["path"])]
        results[kind][name] = nb
    return results, planted


@pytest.mark.slow
@pytest.mark.parametrize("src", SOLUTIONS, ids=[p.parent.name for p in SOLUTIONS])
def test_solution_notebook_scores_full_marks(round_trip, src):
    nb = round_trip[0]["solution"][src.parent.name]
    failed = {c["grade_id"]: c["feedback"][:300] for c in nb["cells"] if not c["passed"]}
    assert nb["max_score"] > 0 and nb["score"] == nb["max_score"] and not failed, (failed, nb["errors"],
                                                                                   nb["integrity"])


@pytest.mark.slow
@pytest.mark.parametrize("src", FULL_ROUND_TRIP, ids=[p.parent.name for p in FULL_ROUND_TRIP])
def test_released_notebook_scores_zero(round_trip, src):
    released_nb = round_trip[0]["released"].get(src.parent.name)
    assert released_nb is not None, f"notebooks/{src.parent.name}/{src.name} is missing: generate it from solutions/"
    passed = [c["grade_id"] for c in released_nb["cells"] if c["passed"]]
    assert released_nb["score"] == 0 and not passed, f"tests pass on the released notebook: {passed}"
    assert released_nb["max_score"] > 0 and not any("grader error" in e for e in released_nb["errors"])


@pytest.mark.slow
@pytest.mark.parametrize("src", FULL_ROUND_TRIP, ids=[p.parent.name for p in FULL_ROUND_TRIP])
def test_planted_bug_loses_its_exercise(round_trip, src):
    results, planted = round_trip
    if src.parent.name not in planted:
        pytest.fail(f"no end-to-end mutant could be planted in {src.parent.name} (autograder.mutants.E2E)")
    exercise, cells = planted[src.parent.name]
    assert cells, f"no graded test cell of {src.parent.name} calls check_{exercise}"
    passed = {kind: {c["grade_id"] for c in results[kind][src.parent.name]["cells"] if c["passed"]}
              for kind in ("solution", "mutant")}
    assert set(cells) <= passed["solution"], "the solution must pass the cells the planted bug should fail"
    lost = passed["solution"] - passed["mutant"]
    assert lost == set(cells), f"planted {exercise}: expected to lose exactly {cells}, lost {sorted(lost)}"


def test_without_a_sandbox_grading_is_refused_unless_unsafe(tmp_path):
    """The sandbox tool pointed at a binary that does not exist: the command refuses, says why and
    how to override; with --unsafe it grades (a notebook without a source: no kernel needed)."""
    import os

    nb = tmp_path / "inbox" / "lost.ipynb"
    nb.parent.mkdir()
    nbformat.write(new_notebook(), nb)
    env = dict(os.environ, AUTOGRADER_BWRAP=str(tmp_path / "no-such-bwrap"))
    command = [sys.executable, "-m", "autograder", "grade", str(nb), "--json", str(tmp_path / "g.json"),
               "--source-dir", str(tmp_path / "none"), "--quiet"]
    refused = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    assert refused.returncode == 3 and not (tmp_path / "g.json").exists()
    assert "refusing to grade: no sandbox" in refused.stderr and "no-such-bwrap not found" in refused.stderr
    assert "--unsafe" in refused.stderr
    unsafe = subprocess.run(command + ["--unsafe"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert unsafe.returncode == 0, unsafe.stderr
    assert "no source notebook" in json.loads((tmp_path / "g.json").read_text())["notebooks"][0]["errors"][0]
