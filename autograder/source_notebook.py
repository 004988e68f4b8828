"""The source notebook of a submission (the instructor's, found by the assignment its folder names)
and the submission restored from it: graded test cells and read-only cells put back from the source,
hidden tests included, matched by nbgrader grade id; answers and added cells stay."""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from .notebook_cells import _nbg, _visible, grade_id, is_protected


def _read(path: Path):
    with open(path, encoding="utf-8") as f:
        return nbformat.read(f, as_version=4)


def source_index(source_dir: Path) -> dict[str, Path]:
    """'<assignment>/<name>.ipynb' -> source path, for nbgrader's source layout
    `<source-dir>/<assignment>/<name>.ipynb` (checkpoints, and notebooks at other depths, ignored)."""
    index: dict[str, Path] = {}
    if not source_dir.is_dir():
        return index
    for path in sorted(source_dir.rglob("*.ipynb")):
        rel = path.relative_to(source_dir)
        if ".ipynb_checkpoints" not in rel.parts and len(rel.parts) == 2:
            index.setdefault(rel.as_posix(), path)
    return index


def source_lookup(submission: Path, index: dict[str, Path]) -> tuple[Path | None, str]:
    """(source, "") for the assignment the submission's folder names, or (None, why not).

    The folder decides, never the file's name or content (nbgrader's layout
    `submitted/<student>/<assignment>/<name>.ipynb`): the source with the same folder and file
    name; else, if that assignment has exactly one notebook, that one (a student's renamed copy:
    `source_mismatch` refuses it if it is another assignment's notebook). A folder that names no
    assignment is refused: a file name alone would let `00_setup.ipynb` in any folder be graded as
    the easiest assignment."""
    folder = submission.parent.name
    if f"{folder}/{submission.name}" in index:
        return index[f"{folder}/{submission.name}"], ""
    assignments: dict[str, list[str]] = {}
    for key in index:
        assignment, name = key.split("/", 1)
        assignments.setdefault(assignment, []).append(name)
    if folder in assignments:
        names = assignments[folder]
        if len(names) == 1:
            return index[f"{folder}/{names[0]}"], ""
        return None, (f"no source notebook for this submission: assignment {folder!r} has no notebook named "
                      f"{submission.name!r} (its notebooks: {', '.join(sorted(names))})")
    known = ", ".join(sorted(assignments)[:30]) or "none"
    return None, (f"no source notebook for this submission: its folder {folder[:100]!r} names no assignment of the "
                  f"source folder (assignments: {known}); hand notebooks in as "
                  "<student>/<assignment>/<notebook>.ipynb (see --source-dir)")


def find_source(submission: Path, index: dict[str, Path]) -> Path | None:
    """The source notebook of a submission (`source_lookup`), or None."""
    return source_lookup(submission, index)[0]


def answer_ids(nb) -> set[str]:
    """The grade ids of a notebook's answer and graded cells: what makes it that assignment."""
    return {str(grade_id(c)) for c in nb.cells if grade_id(c) and (_nbg(c).get("solution") or _nbg(c).get("grade"))}


def source_mismatch(submission, source_ids: set[str], source_name: str, others: dict[str, set[str]]) -> str | None:
    """Why `submission` is not a notebook of the assignment its folder names, or None.

    Refused when fewer than half of the source's answer and graded cells (by nbgrader grade_id)
    are in it while at least half of another source's are (ids the two share are not counted):
    a 00_setup notebook handed in as 01_static_batching. A notebook that lost its metadata matches
    nothing and is graded as usual (its tests are restored from the source)."""
    present = {str(grade_id(c)) for c in submission.cells if grade_id(c)}
    if not source_ids:
        return None
    mine = len(source_ids & present) / len(source_ids)
    best, best_name, best_counts = 0.0, None, (0, 0)
    for name, ids in sorted(others.items()):
        theirs = set(ids) - source_ids
        if name == source_name or not theirs:
            continue
        share = len(theirs & present) / len(theirs)
        if share > best:
            best, best_name, best_counts = share, name, (len(theirs & present), len(theirs))
    if mine >= 0.5 or best < 0.5 or best <= mine:
        return None
    return (f"this notebook does not match {source_name}, the assignment its folder names: "
            f"{len(source_ids & present)} of its {len(source_ids)} answer and graded cells (nbgrader grade_id) "
            f"are in it, while {best_counts[0]} of {best_counts[1]} of {best_name}'s are: it is another "
            f"assignment's notebook, refused and not graded; hand in the notebook of {source_name}")


def _fresh(cell):
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    return cell


def assemble(submission, source) -> tuple[object, list[str]]:
    """The notebook to execute: the submission, with every protected cell taken from the source
    (and put back if deleted), and nbgrader metadata (points!) always from the source."""
    notes: list[str] = []
    src_cells = {grade_id(c): c for c in source.cells if grade_id(c)}
    order = [grade_id(c) for c in source.cells if grade_id(c)]
    out = []
    seen = set()
    for cell in submission.cells:
        cell = _fresh(cell)
        cell.setdefault("metadata", {})
        gid = grade_id(cell)
        if gid and (gid in seen or gid not in src_cells):
            notes.append(f"cell with grade_id {gid!r} is not in the source (or duplicated): graded as a plain cell")
            cell["metadata"].pop("nbgrader", None)
            gid = None
        if gid:
            seen.add(gid)
            src = src_cells[gid]
            if is_protected(src):
                restored = _fresh(src)
                if _visible(restored.get("source", "")) != _visible(cell.get("source", "")):
                    notes.append(f"restored {gid!r} from the source (it had been edited)")
                cell = restored
            else:
                cell["metadata"]["nbgrader"] = copy.deepcopy(_nbg(src))
                cell["cell_type"] = src.get("cell_type", cell.get("cell_type"))
            cell["metadata"]["autograder"] = {"origin": "source" if is_protected(src) else "submission"}
        else:
            cell["metadata"]["autograder"] = {"origin": "submission"}
        out.append(cell)
    # Protected cells the student deleted go back after the nearest earlier source cell present.
    for i, gid in enumerate(order):
        if gid in seen or not is_protected(src_cells[gid]):
            continue
        position = 0
        for earlier in reversed(order[:i]):
            idx = next((j for j, c in enumerate(out) if grade_id(c) == earlier), None)
            if idx is not None:
                position = idx + 1
                break
        cell = _fresh(src_cells[gid])
        cell.setdefault("metadata", {})["autograder"] = {"origin": "source"}
        out.insert(position, cell)
        seen.add(gid)
        notes.append(f"restored {gid!r} from the source (it had been deleted)")
    nb = copy.deepcopy(source)
    nb.cells = out
    nb.metadata = copy.deepcopy(source.metadata)
    return nb, notes
