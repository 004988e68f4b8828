"""The graded seeds of an exercise, read from the instructor's solution notebook (its graded test
cell's check calls: the visible seed, then the hidden ones); see `autograder.hidden_seeds`."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .cell_plan import plan_cell
from .notebook_cells import hidden_line_ranges

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"


class NoSolutions(LookupError):
    """The instructor's notebooks are not here (an installed wheel has none)."""


def seeds_in_cell(source: str, exercise: str, visible_seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(visible, hidden) seeds of the check_<exercise> calls in one test cell's source, in order;
    `visible_seed`: the exercise's seed for a call written without one."""
    plan = [p for p in plan_cell(source, hidden_line_ranges(source), lambda _: visible_seed) if p.exercise == exercise]
    visible = tuple(dict.fromkeys(p.seed for p in plan if not p.hidden))
    hidden = tuple(dict.fromkeys(p.seed for p in plan if p.hidden and p.seed not in visible))
    return visible, hidden


@functools.lru_cache(maxsize=64)
def _test_cells(path: str, mtime_ns: int) -> dict[str, str]:
    del mtime_ns  # (part of the cache key: an edited notebook is read again)
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    cells = {}
    for cell in nb.get("cells", []):
        gid = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
        if gid:
            source = cell.get("source", "")
            cells[gid] = source if isinstance(source, str) else "".join(source)
    return cells


def solution_notebook(exercise, solutions: Path = SOLUTIONS) -> Path:
    return solutions / exercise.assignment / f"{exercise.assignment}.ipynb"


def graded_seeds(exercise, solutions: Path = SOLUTIONS) -> tuple[int, ...]:
    """Every seed grading calls `exercise`'s check with: the visible ones, then the hidden ones,
    as the instructor's solution notebook writes them."""
    path = solution_notebook(exercise, solutions)
    try:
        cells = _test_cells(str(path), path.stat().st_mtime_ns)
    except OSError:
        raise NoSolutions(f"the hidden seeds of {exercise.adapter} live only in the instructor's notebook {path}, "
                          "which is not here (an installed package ships no solutions): run this from the course "
                          "repository") from None
    source = cells.get(exercise.test_cell)
    if source is None:
        raise NoSolutions(f"{path} has no graded test cell {exercise.test_cell!r}")
    visible, hidden = seeds_in_cell(source, exercise.adapter, exercise.visible_seed)
    return visible + hidden
