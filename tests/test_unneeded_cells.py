"""Cells past the last graded test whose output would not come back are not run (issue 23,
throughput: nb05's load sweep was 14 s of its 20): the score cannot depend on them, and what they
would print is withheld anyway. A cell whose output does come back still runs."""
from __future__ import annotations

import time

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder import grade as G

TEST = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False, "locked": True}}
HIDDEN = "assert x == 1, 'x is 1'\n### BEGIN HIDDEN TESTS\nassert x > 0\n### END HIDDEN TESTS"


def _run(tmp_path, cells):
    path = tmp_path / "n.ipynb"
    nb = new_notebook(cells=cells)
    nbformat.write(nb, path)
    began = time.monotonic()
    out = G.run_in_sandbox(nbformat.read(path, as_version=4), path, timeout=60, kernel_name="python3",
                           budget_s=120, sandbox=None, tokens_guard=None)
    return out[1], time.monotonic() - began


def test_a_cell_after_the_last_hidden_test_is_not_run(tmp_path):
    status, took = _run(tmp_path, [new_code_cell("x = 1"), new_code_cell(HIDDEN, metadata=TEST),
                                   new_markdown_cell("Question 1"), new_code_cell("import time\ntime.sleep(40)")])
    assert status == {0: "ok", 1: "ok", 3: "skipped"}
    assert took < 35, f"the sleeping cell ran ({took:.0f} s)"


def test_cells_whose_output_comes_back_still_run(tmp_path):
    visible_only = "assert x == 1, 'x is 1'"
    status, _ = _run(tmp_path, [new_code_cell("x = 1"), new_code_cell(visible_only, metadata=TEST),
                                new_code_cell("y = 2\nprint(y)")])
    assert status == {0: "ok", 1: "ok", 2: "ok"}, "no hidden test: every output comes back, every cell runs"


def test_unneeded_from_names_the_first_cell_past_both_limits():
    nb = new_notebook(cells=[new_code_cell("a"), new_code_cell(HIDDEN, metadata=TEST), new_code_cell("b"),
                             new_code_cell(HIDDEN, metadata=TEST), new_code_cell("c")])
    assert G.unneeded_from(nb, outputs_before=1) == 4
    assert G.unneeded_from(nb, outputs_before=5) == 5
    assert G.unneeded_from(new_notebook(cells=[new_code_cell("a")]), outputs_before=1) is None
