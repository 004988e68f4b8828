"""Make example submissions from an nbgrader source notebook: what a perfect student, a student who
hands in the released notebook untouched, and a student with one realistic bug would submit.

Used by `python -m autograder demo-course` and by the end-to-end grading tests.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import re
from pathlib import Path

from .notebook_cells import grade_id

_SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.M)
_HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.M | re.S)


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_solution_cell(cell) -> bool:
    return bool(_nbg(cell).get("solution")) and cell.get("cell_type") == "code"


def perfect_submission(source, release=None):
    """The release notebook with every answer cell holding the source's solution (markers removed).
    Without a release notebook, the source itself with its markers and hidden tests removed."""
    answers = {grade_id(c): _SOLUTION_MARKERS.sub("", c.source) for c in source.cells if is_solution_cell(c)}
    nb = copy.deepcopy(release if release is not None else source)
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid in answers:
            cell.source = answers[gid]
        elif release is None and cell.get("cell_type") == "code":
            cell.source = _HIDDEN_TESTS.sub("", cell.source)
        if cell.get("cell_type") == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


_SOLUTION_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION.*?### END SOLUTION[ \t]*$", re.M | re.S)


def released_submission(source):
    """What nbgrader's ClearSolutions makes of `source` (the notebook a student starts from, handed
    in untouched): each solution region becomes the stub, hidden tests are removed."""
    nb = copy.deepcopy(source)
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        cell.source = _HIDDEN_TESTS.sub("", cell.source)
        if is_solution_cell(cell):
            cell.source = _SOLUTION_REGION.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()",
                                               cell.source)
        cell.outputs, cell.execution_count = [], None
    return nb


def with_answer(nb, grade_id_: str, code: str):
    """`nb` with the answer cell `grade_id_` holding `code` (what a student types there)."""
    nb = copy.deepcopy(nb)
    cells = [c for c in nb.cells if grade_id(c) == grade_id_]
    if not cells:
        raise KeyError(f"no cell {grade_id_!r}")
    cells[0].source = code
    return nb


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^(def|class)\s+{re.escape(name)}\b", source, re.M) is not None


def mutant_source(mutant, adapter: str) -> str:
    """A cell that defines `adapter` as `mutant`: the mutant's whole module (it imports nothing
    from the autograder, so it runs anywhere), then the rebinding."""
    module = inspect.getmodule(mutant)
    return f"{inspect.getsource(module)}\n\n{adapter} = {mutant.__name__}\n"


def plant_mutant(nb, exercise: str, mutant):
    """`nb` with `mutant` appended to the answer cell that defines `exercise`; None if no such cell."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if is_solution_cell(cell) and _defines(cell.source, exercise):
            cell.source = cell.source.rstrip() + "\n\n# --- planted bug: " + (inspect.getdoc(mutant) or "").splitlines()[0] \
                + "\n" + mutant_source(mutant, exercise)
            return nb
    return None


def mutant_for(notebook_path, source) -> tuple[str, object] | None:
    """The (exercise, mutant) to plant in this notebook: the end-to-end mutant of its course
    notebook (assignment `03_paged_kv` -> `autograder.mutants.E2E["nb03_paged_kv"]`), else the
    first registered mutant of an exercise one of its answer cells defines."""
    from .mutants import E2E, REGISTRY

    assignment = Path(notebook_path).parent.name
    choice = E2E.get(f"nb{assignment}")
    if choice is not None:
        exercise, name = choice
        module = importlib.import_module(f"autograder.mutants.nb{assignment}")
        return exercise, getattr(module, name)
    answers = "\n".join(c.source for c in source.cells if is_solution_cell(c))
    for exercise, mutants in REGISTRY.items():
        if mutants and _defines(answers, exercise):
            return exercise, mutants[0]
    return None


def graded_cells_calling(nb, exercise: str) -> list[str]:
    """grade_ids of the graded test cells that call check_<exercise>."""
    from .notebook_cells import is_test_cell

    return [grade_id(c) for c in nb.cells if is_test_cell(c) and re.search(rf"\bcheck_{exercise}\s*\(", c.source)]
