"""Run All reaches the end of a student notebook whose exercises are unfinished (docs/run_all.md).

- the generator tags every cell of a student notebook that may raise because an exercise is
  unfinished `raises-exception`, and no instructor notebook carries the tag;
- a small generated assignment, executed as Run All does (nbclient stops at an error unless the
  cell is tagged), reaches its last cell, and the cell after the exercise falls back to the
  course's piece when the exercise is unfinished or failed its check, naming the exercise.

Every real student notebook under Run All in a browser: tests/test_browser_jupyterlab.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import generate_notebooks  # noqa: E402

TAG = generate_notebooks.RAISES_TAG


def _nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def _is_autograded_test(cell) -> bool:
    return cell.cell_type == "code" and _nbgrader(cell).get("grade") and not _nbgrader(cell).get("solution")


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    sources = ROOT / generate_notebooks.SOURCE_DIR
    generate_notebooks.generate(sources, out, generate_notebooks.assignments(sources))
    return out


def test_student_test_cells_are_tagged_and_instructor_cells_are_not(generated):
    students = sorted(generated.glob("*/*.ipynb"))
    assert len(students) == len(generate_notebooks.assignments(ROOT / "solutions"))
    for path in students:
        nb = nbformat.read(path, as_version=4)
        tests = [c for c in nb.cells if _is_autograded_test(c)]
        if not any(_nbgrader(c).get("solution") for c in nb.cells):
            continue  # a demo (notebook 08): nothing to hand in, nothing to tag
        assert tests, f"{path.name}: no autograded test cell"
        untagged = [c.metadata["nbgrader"]["grade_id"] for c in tests if TAG not in c.metadata.get("tags", [])]
        assert not untagged, f"{path.name}: test cells without {TAG}: {untagged}"
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        tagged = [i for i, c in enumerate(nb.cells) if TAG in c.metadata.get("tags", [])]
        assert not tagged, f"{path.relative_to(ROOT)}: cells {tagged} carry {TAG}: an error there would not fail CI"


@pytest.mark.parametrize("source, tagged", [
    ("def f(x):\n    raise NotImplementedError()", False),  # a function's body: raises only when called
    ("class C:\n    def f(self):\n        raise NotImplementedError()", False),
    ("x = 1\nraise NotImplementedError()", True),  # top-level solution region
    ("if True:\n    raise NotImplementedError", True),
    ("%matplotlib inline\nraise NotImplementedError()", True),  # a magic: read as text
    ("print('fine')", False),
])
def test_which_cells_may_raise(source, tagged):
    assert generate_notebooks.may_raise_when_unfinished(nbformat.v4.new_code_cell(source)) is tagged


def test_author_tag_and_markdown():
    marked = nbformat.v4.new_code_cell("student_fn(3)")
    marked.metadata["tags"] = [generate_notebooks.AUTHOR_TAG]
    assert generate_notebooks.may_raise_when_unfinished(marked)
    assert not generate_notebooks.may_raise_when_unfinished(nbformat.v4.new_markdown_cell("raise NotImplementedError"))


# ----------------------------------------------------------------------------------- a small assignment
def _meta(grade_id, *, grade=False, solution=False, locked=True, points=None):
    meta = {"grade": grade, "solution": solution, "locked": locked, "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _write_demo_assignment(root: Path) -> None:
    cells = [
        nbformat.v4.new_markdown_cell("# Demo\n\nA one-exercise assignment.", metadata=_meta("md-1")),
        nbformat.v4.new_code_cell("from course_lib.course import checking, use_or_reference", metadata=_meta("setup")),
        nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                                  metadata=_meta("double", solution=True, locked=False)),
        nbformat.v4.new_code_cell('checking("double")\nassert double(2) == 4, f"double(2) should be 4, got {double(2)}"',
                                  metadata=_meta("double_tests", grade=True, points=1)),
        nbformat.v4.new_code_cell('fn = use_or_reference("double", double, lambda x: 2 * x)\nprint("double(3) =", fn(3))'),
        nbformat.v4.new_markdown_cell("## Summary", metadata=_meta("md-2")),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    folder = root / "solutions" / "99_demo"
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "99_demo.ipynb")


def _run_all(nb) -> list[str]:
    """Execute like JupyterLab's Run All; the text each code cell printed."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False).execute()
    return ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells if c.cell_type == "code"]


@pytest.fixture(scope="module")
def demo_student(tmp_path_factory) -> nbformat.NotebookNode:
    root = tmp_path_factory.mktemp("demo")
    _write_demo_assignment(root)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_notebooks.py"), "--root", str(root)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return nbformat.read(root / "notebooks" / "99_demo" / "99_demo.ipynb", as_version=4)


def _with_answer(student, body: str):
    nb = nbformat.from_dict(student)  # a copy
    solution = next(c for c in nb.cells if _nbgrader(c).get("solution"))
    solution.source = f"def double(x):\n    {body}"
    return nb


@pytest.mark.slow
def test_run_all_goes_past_an_unfinished_exercise_and_falls_back(demo_student):
    printed = _run_all(nbformat.from_dict(demo_student))
    assert "raise NotImplementedError()" in next(c.source for c in demo_student.cells if _nbgrader(c).get("solution"))
    assert "your double is not finished yet: using course_lib's reference" in printed[-1], printed
    assert "double(3) = 6" in printed[-1]


@pytest.mark.slow
def test_a_failed_check_falls_back_naming_the_exercise_and_a_passed_one_does_not(demo_student):
    wrong = _run_all(_with_answer(demo_student, "return x + 5"))  # finished, but wrong
    assert ("your double failed its check above (AssertionError: double(2) should be 4, got 7): "
            "using course_lib's reference so you can keep going") in wrong[-1], wrong
    assert "double(3) = 6" in wrong[-1]
    assert "passed:" not in wrong[-2]
    right = _run_all(_with_answer(demo_student, "return x * 2"))
    assert "passed: double's visible check" in right[-2], right  # a pass is said, not silent
    assert "using your double" in right[-1] and "double(3) = 6" in right[-1], right
