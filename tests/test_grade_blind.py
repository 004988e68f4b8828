"""Honest notebooks written blind (issue 23; notebook 09 from its own trial, issue 27): helpers wrote every exercise of the course from the
released notebooks' text alone (no hint before an attempt, no solution, no checks, no course_lib
source of the piece), one notebook each in tests/data/blind_honest/<student>/<assignment>/. Graded by
`python -m autograder grade`'s own code against the course's sources, in one batch, each must get
full marks with no flag, no integrity finding, no copy evidence and no error: a grader that accuses
honest students, or fails them for writing it their own way, cannot be used for a real class.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from autograder import grade as G
from autograder.exercises import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
BLIND = ROOT / "tests" / "data" / "blind_honest"


def test_blind_honest_notebooks_get_full_marks_and_no_flag(tmp_path):
    submitted = tmp_path / "submitted"
    shutil.copytree(BLIND, submitted)
    paths = sorted(submitted.glob("*/*/*.ipynb"))
    graded = {e.assignment for e in EXERCISES}
    assert sorted({p.parent.name for p in paths}) == sorted(graded), "one blind notebook for each graded notebook"
    assert len(paths) == len(graded), "one blind notebook for each graded notebook, no more"
    result = G.grade(paths, source_dir=ROOT / "solutions", jobs=2, out_dir=tmp_path / "results",
                     html_dir=tmp_path / "html", roots=[submitted], progress=False)
    for entry in result["notebooks"]:
        where = f"{entry['student']}/{entry['notebook']}"
        assert entry["max_score"] > 0 and entry["score"] == entry["max_score"], (where, entry["cells"])
        assert not entry["flags"] and not entry.get("copies"), (where, entry["flags"])
        assert not entry["integrity"] and not entry["errors"], (where, entry["integrity"], entry["errors"])
    assert result["score"] == result["max_score"] == sum(e.points for e in EXERCISES)


def test_the_stored_notebooks_are_written_as_the_checklist_says():
    """docs/adding_an_exercise.md (step 11) writes a stored notebook back as plain JSON, indent 1, with a
    trailing newline and no outputs, so that a maintainer's diff shows only the cells they added."""
    import json

    for path in sorted(BLIND.glob("*/*/*.ipynb")):
        text = path.read_text(encoding="utf-8")
        notebook = json.loads(text)
        assert text == json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", f"{path} is not written as the others"
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path}: a cell kept its outputs"
