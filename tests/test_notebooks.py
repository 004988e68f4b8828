"""The course notebooks: their structure, the student versions, and what a new student sees.

- Every instructor notebook (solutions/<assignment>/<assignment>.ipynb) opens with a title, an
  "Open in Colab" badge and learning objectives, ends with a summary and questions, and has 2-4
  graded exercises: a solution cell (### BEGIN/END SOLUTION) followed by an autograded test cell
  (visible checks, then ### BEGIN/END HIDDEN TESTS) that calls the autograder's checks.
- The student notebooks (notebooks/) are exactly what `scripts/generate_notebooks.py` makes of them
  (`--check`), hold no solutions or hidden tests, and no notebook stores outputs or widget state.
- A new student's notebook runs top to bottom with the only errors being the unfinished exercises'
  test cells (a NotImplementedError, or an AssertionError from a check). Every other cell works:
  cells after an exercise fall back to course_lib's reference and say so.

Executing the solution notebooks themselves is nbval's job: `pytest --nbval-lax --nbval-current-env
solutions/`. Executing the student notebooks takes 10-30 s each on a 2-core CPU (all eight: about
2.5 minutes, up to 5 on a busy machine), so a local run executes DEFAULT_STUDENT_RUNS and CI (the `CI`
environment variable set) executes all of them; `COURSE_STUDENT_NOTEBOOKS=all|default|a,b,...` overrides.
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import notebook_cells  # noqa: E402  (scripts/: renders the badge block from course_lib/publish_settings.py)
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
ASSIGNMENTS = [
    "00_setup",
    "01_static_batching",
    "02_continuous_batching",
    "03_paged_kv",
    "04_paged_attention",
    "05_hundred_users",
    "06_prefix_caching",
    "07_admission_control",
    "09_speculative_decoding",
]
# Demos: nothing to hand in (no graded cell), otherwise the same layout (title, badge, objectives, summary).
DEMOS = ["08_live_serving"]
NOTEBOOKS_ALL = sorted(ASSIGNMENTS + DEMOS)
# Student notebooks executed in the default test run (the others with COURSE_STUDENT_NOTEBOOKS=all).
DEFAULT_STUDENT_RUNS = ["00_setup", "06_prefix_caching"]

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def solution_path(assignment: str) -> Path:
    return SOLUTIONS / assignment / f"{assignment}.ipynb"


def student_path(assignment: str) -> Path:
    return NOTEBOOKS / assignment / f"{assignment}.ipynb"


def read(path: Path):
    return nbformat.read(path, as_version=4)


def nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_solution(cell) -> bool:
    return cell.cell_type == "code" and nbgrader(cell).get("solution", False)


def is_test(cell) -> bool:
    return cell.cell_type == "code" and nbgrader(cell).get("grade", False)


def exercises(nb):
    """[(solution cell, test cell)] in order; every solution cell must be followed by its test cell."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    pairs = []
    for i, cell in enumerate(code):
        if is_solution(cell):
            following = code[i + 1] if i + 1 < len(code) else None
            pairs.append((cell, following))
    return pairs


# ----------------------------------------------------------------------------------- layout
def test_every_assignment_has_a_solution_and_a_student_notebook():
    found = sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir())
    assert found == NOTEBOOKS_ALL, f"solutions/ holds {found}, expected {NOTEBOOKS_ALL}"
    for assignment in NOTEBOOKS_ALL:
        assert solution_path(assignment).is_file(), f"missing {solution_path(assignment).relative_to(ROOT)}"
        assert student_path(assignment).is_file(), (
            f"missing {student_path(assignment).relative_to(ROOT)}: run python scripts/generate_notebooks.py")


# ----------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("assignment", NOTEBOOKS_ALL)
def test_opens_with_title_colab_badge_and_objectives(assignment):
    nb = read(solution_path(assignment))
    first = nb.cells[0]
    assert first.cell_type == "markdown", "the first cell must be markdown (title, badge, objectives)"
    assert first.source.lstrip().startswith("# "), "the first cell must start with a '# ' title"
    repo, version = notebook_cells.settings()
    block = notebook_cells.badge_block(assignment, repo, version)
    assert block in first.source, (f"the first cell needs the badge block course_lib/publish_settings.py gives "
                                   f"(an 'Open in Colab' badge once published):\n{block}\nrun python scripts/publish.py")
    assert "In this notebook you will" in first.source, "the first cell must list the learning objectives"
    objectives = [line for line in first.source.split("In this notebook you will", 1)[1].splitlines()
                  if line.strip().startswith("- ")]
    assert len(objectives) >= 3, f"list at least 3 learning objectives, found {len(objectives)}"


@pytest.mark.parametrize("assignment", NOTEBOOKS_ALL)
def test_ends_with_summary_and_questions(assignment):
    """A summary last; the questions either follow it (numbered) or are the notebook's manually graded
    answer cells (course v2 asks them where the measurement is, with room for the answer)."""
    nb = read(solution_path(assignment))
    last = nb.cells[-1]
    assert last.cell_type == "markdown", "the last cell must be markdown: a summary and questions"
    assert "## Summary" in last.source, "the last cell must start a '## Summary' section"
    answer_cells = [c for c in nb.cells if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("grade")]
    if re.search(r"\*\*(Questions to think about|More to think about[^*]*|Homework[^*]*)\*\*", last.source):
        assert re.search(r"^\s*1\. ", last.source, re.M), "the questions should be a numbered list"
    else:
        assert len(answer_cells) >= 2, ("end with questions to think about, or ask them in at least two "
                                        f"manually graded answer cells (found {len(answer_cells)})")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_has_two_to_four_graded_exercises(assignment):
    nb = read(solution_path(assignment))
    pairs = exercises(nb)
    assert 2 <= len(pairs) <= 4, f"{assignment} has {len(pairs)} exercises, expected 2-4"
    assert len([c for c in nb.cells if is_test(c)]) == len(pairs), "every test cell must belong to one exercise"
    module = f"nb{assignment}"
    for solution, test in pairs:
        gid = nbgrader(solution)["grade_id"]
        src = solution.source
        assert src.count(BEGIN_SOLUTION) == src.count(END_SOLUTION) >= 1, f"{gid}: unbalanced solution markers"
        assert nbgrader(solution) == {"solution": True, "grade": False, "locked": False, "grade_id": gid,
                                      "schema_version": 3}, f"{gid}: unexpected nbgrader metadata {nbgrader(solution)}"
        assert test is not None and is_test(test), f"{gid}: the cell after the solution must be its test cell"
        meta = nbgrader(test)
        assert meta.get("locked") is True and meta.get("solution") is False, f"{gid}: test cells are locked"
        assert isinstance(meta.get("points"), int) and meta["points"] > 0, f"{gid}: a test cell needs points > 0"
        body = test.source
        assert body.count(BEGIN_HIDDEN) == 1 and body.count(END_HIDDEN) == 1, f"{gid}: needs one hidden-test block"
        visible, hidden = body.split(BEGIN_HIDDEN)
        assert f"from autograder.checks import {module} as checks" in visible, (
            f"{gid}: the test cell must use autograder.checks.{module}")
        assert re.search(r"checks\.check_\w+\(", visible), f"{gid}: visible tests must call a check"
        assert re.search(r"checks\.check_\w+\(", hidden), f"{gid}: hidden tests must call a check"
        checks = importlib.import_module(f"autograder.checks.{module}")
        for name in re.findall(r"checks\.(check_\w+)\(", body):
            assert hasattr(checks, name), f"{gid}: autograder.checks.{module} has no {name}"


@pytest.mark.parametrize("demo", DEMOS)
def test_a_demo_has_nothing_to_grade(demo):
    graded = [nbgrader(c)["grade_id"] for c in read(solution_path(demo)).cells if nbgrader(c).get("grade")
              or nbgrader(c).get("solution")]
    assert not graded, f"{demo} is a demo: it has graded cells {graded} (move it to ASSIGNMENTS, with checks)"


@pytest.mark.parametrize("assignment", NOTEBOOKS_ALL)
def test_grade_ids_unique_and_kernel_python3(assignment):
    nb = read(solution_path(assignment))
    ids = [nbgrader(c)["grade_id"] for c in nb.cells if nbgrader(c)]
    assert len(ids) == len(set(ids)), f"duplicate grade_ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "google.colab" in first_code.source and "pip" in first_code.source, (
        "the first code cell installs course_lib on Colab (and does nothing elsewhere)")


@pytest.mark.parametrize("assignment", NOTEBOOKS_ALL)
@pytest.mark.parametrize("kind", ["solutions", "notebooks"])
def test_no_outputs_or_widget_state_stored(assignment, kind):
    path = solution_path(assignment) if kind == "solutions" else student_path(assignment)
    nb = read(path)
    assert "widgets" not in nb.metadata, f"{path.relative_to(ROOT)} stores widget state"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.relative_to(ROOT)} cell {i} has outputs"


# ----------------------------------------------------------------------------------- student versions
@pytest.mark.parametrize("assignment", NOTEBOOKS_ALL)
def test_student_notebook_has_no_solutions_or_hidden_tests(assignment):
    student = read(student_path(assignment))
    text = nbformat.writes(student)
    for marker in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN):
        assert marker not in text, f"the student notebook contains {marker!r}"
    pairs = exercises(student)
    assert len(pairs) == len(exercises(read(solution_path(assignment))))
    for solution, _ in pairs:
        assert "raise NotImplementedError()" in solution.source, "each exercise starts as raise NotImplementedError()"


def test_generated_notebooks_are_up_to_date():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_notebooks.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (ROOT / "gradebook.db").exists(), "generating notebooks must not leave a gradebook.db in the repo"


def test_generator_cleans_a_saved_notebook_and_check_catches_it(tmp_path):
    """An instructor saves a solution with outputs and widget state: --check fails, a plain run
    cleans the source and regenerates, and --check passes again."""
    import shutil

    for folder in ("solutions", "notebooks"):
        shutil.copytree(ROOT / folder / "00_setup", tmp_path / folder / "00_setup")
    source = tmp_path / "solutions" / "00_setup" / "00_setup.ipynb"
    nb = read(source)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code.execution_count = 3
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, source)
    script = [sys.executable, str(ROOT / "scripts" / "generate_notebooks.py"), "--root", str(tmp_path),
              "--assignment", "00_setup"]
    dirty = subprocess.run(script + ["--check"], capture_output=True, text=True)
    assert dirty.returncode == 1 and "not normalised" in dirty.stdout, dirty.stdout + dirty.stderr
    fixed = subprocess.run(script, capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    cleaned = read(source)
    assert "widgets" not in cleaned.metadata and not next(c for c in cleaned.cells if c.cell_type == "code").outputs
    assert subprocess.run(script + ["--check"], capture_output=True, text=True).returncode == 0
    assert not (tmp_path / "gradebook.db").exists()


# ----------------------------------------------------------------------------------- a new student
def _student_runs():
    """COURSE_STUDENT_NOTEBOOKS: "all", "default", or a comma-separated list of assignments.
    Unset: all of them under CI (the CI variable is set), DEFAULT_STUDENT_RUNS otherwise."""
    choice = os.environ.get("COURSE_STUDENT_NOTEBOOKS", "").strip() or ("all" if os.environ.get("CI") else "default")
    if choice == "all":
        wanted = ASSIGNMENTS
    elif choice == "default":
        wanted = DEFAULT_STUDENT_RUNS
    else:
        wanted = [a.strip() for a in choice.split(",") if a.strip()]
        unknown = sorted(set(wanted) - set(ASSIGNMENTS))
        if unknown:
            raise ValueError(f"COURSE_STUDENT_NOTEBOOKS names unknown assignments {unknown}; known: {ASSIGNMENTS}")
    return [pytest.param(a, marks=pytest.mark.slow) for a in wanted]


@pytest.mark.parametrize("assignment", _student_runs())
def test_student_notebook_runs_with_only_unfinished_exercise_errors(assignment):
    from nbclient import NotebookClient

    path = student_path(assignment)
    nb = read(path)
    NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    unfinished = False
    failed_tests, unexpected = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if is_solution(cell) and "raise NotImplementedError()" in cell.source:
            unfinished = True
        errors = [o for o in cell.outputs if o.output_type == "error"]
        follows_unfinished = False
        if is_test(cell):
            follows_unfinished = unfinished
            if unfinished:
                failed_tests.append(bool(errors))
            unfinished = False
        if not errors:
            continue
        error = errors[0]
        # Only the test cell of an unfinished exercise may fail; every other cell must fall back to the
        # reference (a NotImplementedError anywhere else means a fallback is missing).
        expected = is_test(cell) and follows_unfinished and error.ename in ("NotImplementedError", "AssertionError")
        if not expected:
            trace = "\n".join(error.traceback)[-3000:]
            unexpected.append(f"cell {i} raised {error.ename}: {error.evalue}\n{cell.source[:400]}\n{trace}")
    assert not unexpected, "\n\n".join(unexpected)
    assert failed_tests and all(failed_tests), (
        f"every test cell of an unfinished exercise must fail (got {failed_tests}): a check that passes on "
        "`raise NotImplementedError()` cannot grade anything")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "not finished yet: using course_lib's reference" in text, (
        "cells after an unfinished exercise should fall back to the reference and say so")


# ----------------------------------------------------------------------------------- course_lib.course
def _unfinished_function(x):
    # YOUR CODE HERE
    raise NotImplementedError()


class _UnfinishedClass:
    def __init__(self, n):
        self.n = n

    @property
    def size(self):
        # YOUR CODE HERE
        raise NotImplementedError()


class _FinishedClass:
    def __init__(self, n):
        self.n = n

    @property
    def size(self):
        return self.n


def test_use_or_reference_falls_back_and_says_so(capsys):
    from course_lib.course import is_unfinished, use_or_reference

    def finished(x):
        return x + 1

    def reference(x):
        return x + 1

    assert is_unfinished(_unfinished_function) and is_unfinished(_UnfinishedClass) and is_unfinished(None)
    assert not is_unfinished(finished) and not is_unfinished(_FinishedClass)
    assert use_or_reference("f", _unfinished_function, reference) is reference
    assert "your f is not finished yet: using course_lib's reference so you can keep going" in capsys.readouterr().out
    assert use_or_reference("C", _UnfinishedClass, _FinishedClass) is _FinishedClass
    assert use_or_reference("f", finished, reference) is finished
    assert "using your f" in capsys.readouterr().out

    def failing_probe(fn):
        raise AssertionError("f(1) should be 2")

    assert use_or_reference("f", finished, reference, probe=failing_probe) is reference
    assert "does not pass its checks yet (AssertionError: f(1) should be 2)" in capsys.readouterr().out


def test_fast_mode_follows_the_environment(monkeypatch):
    from course_lib.course import fast_mode, has_cuda

    monkeypatch.setenv("COURSE_FAST", "0")
    assert fast_mode() is False
    monkeypatch.setenv("COURSE_FAST", "1")
    assert fast_mode() is True
    monkeypatch.delenv("COURSE_FAST")
    assert fast_mode() is (not has_cuda())


def test_environment_report_has_the_basics():
    from course_lib.course import environment_report

    report = environment_report(show=False)
    for key in ("python", "torch", "cuda", "cpu_cores", "colab", "fast_mode", "tiny_model"):
        assert key in report, key


def test_padded_forward_matches_each_prompt_alone():
    import torch

    from course_lib.course import padded_forward
    from course_lib.model.config import ModelConfig
    from course_lib.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=31, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                    num_kv_heads=2, max_position_embeddings=64)).double().eval()
    prompts = [[5, 6, 7, 8, 9], [10], [11, 12, 13]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    logits = padded_forward(model, ids, mask)
    for row, prompt in enumerate(prompts):
        alone = model.dense_logits([prompt])[0]
        assert torch.allclose(logits[row, width - len(prompt):], alone, atol=1e-10), f"row {row} differs"
