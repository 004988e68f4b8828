"""What a batch does with names, paths and files a student chose, before any kernel runs.

Result names are collision-free and path-safe for any name; summary.csv cells are never formulas;
symbolic links are refused by name and never followed; a notebook is graded against the
assignment its folder names, and another assignment's notebook is refused. No kernel: refused
submissions never reach one.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder import batch as B
from autograder import grade as G

KEY_TEXT = "ANSWER KEY: return 2 * config.num_layers"


def _meta(gid, **flags):
    return {"nbgrader": {"grade_id": gid, "schema_version": 3, "locked": False, "solution": False, "grade": False,
                         **flags}}


def assignment(prefix: str, points=1):
    """A source notebook: an answer cell and its graded test cell, ids prefixed by the assignment."""
    return new_notebook(cells=[
        new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                      metadata=_meta(f"{prefix}_answer", solution=True)),
        new_code_cell("assert f() == 1", metadata=_meta(f"{prefix}_tests", grade=True, locked=True, points=points)),
    ])


@pytest.fixture
def course(tmp_path, monkeypatch):
    """tmp/source/{easy,hard}/<same>.ipynb, tmp/key.txt, and an empty tmp/submitted/; cwd = tmp."""
    monkeypatch.chdir(tmp_path)
    for name in ("easy", "hard"):
        (tmp_path / "source" / name).mkdir(parents=True)
        nbformat.write(assignment(name, points=2 if name == "hard" else 1), tmp_path / "source" / name / f"{name}.ipynb")
    (tmp_path / "key.txt").write_text(KEY_TEXT)
    (tmp_path / "submitted").mkdir()
    return tmp_path


def submit(student: str, folder: str, name: str, nb=None) -> Path:
    path = Path("submitted") / student / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb if nb is not None else assignment(folder), path)
    return path


# ---------------------------------------------------------------------------------------------
# Result names
# ---------------------------------------------------------------------------------------------

HOSTILE_NAMES = ["alice", "José", "Josè", "Jose", "jose", "李雷", "韩梅梅", "..", ".", "../../etc", "a/b", "a__b",
                 "line\nbreak", "tab\there", "=HYPERLINK(\"x\")", "x" * 5000, "\udcff\udcfe", "CON", " ", ""]


def test_result_names_are_distinct_ascii_file_names_for_any_student_and_notebook(tmp_path):
    pairs = [(s, n) for s in HOSTILE_NAMES for n in ("00_setup/00_setup.ipynb", "00_setup__00_setup.ipynb",
                                                      "../../x.ipynb", "ü/ü.ipynb")]
    names = [B.result_name(s, n) for s, n in pairs]
    assert len(set(names)) == len(pairs), "two (student, notebook) pairs share a result file"
    assert len({n.lower() for n in names}) == len(pairs), "names differing only in case collide on macOS"
    for name in names:
        assert name.isascii() and name.endswith(".json") and "/" not in name and "\\" not in name
        assert not name.startswith(".") and len(name.encode()) < 120 and name.isprintable(), name
        assert B.inside(tmp_path, name) == tmp_path.resolve() / name
    assert B.result_name("José", "00_setup/00_setup.ipynb") == B.result_name("José", "00_setup/00_setup.ipynb")
    assert B.result_name("José", "00_setup/00_setup.ipynb").startswith("Jose__00_setup__00_setup__")
    # (the page's name is the JSON's with another suffix, even for a student called "x.json")
    assert B.result_name("x.json", "b.ipynb", ".html") == B.result_name("x.json", "b.ipynb")[:-5] + ".html"


@pytest.mark.parametrize("name", ["../x.json", "a/b.json", "..", ".", "/etc/passwd"])
def test_a_path_outside_the_folder_is_never_written(tmp_path, name):
    with pytest.raises(ValueError, match="not a file name inside"):
        B.inside(tmp_path, name)


def test_a_student_with_a_newline_and_slashes_in_their_folder_name_gets_one_file(tmp_path):
    entry = {"path": "p", "score": 0.0, "max_score": 0.0, "cells": [], "integrity": [], "flags": [], "errors": []}
    task = {"path": "p", "source": None, "source_copy": None, "student": "../../evil\nname", "refused": "refused",
            "notebook": "../../../x.ipynb", "sha256": "", "html_dir": str(tmp_path / "html"),
            "out_dir": str(tmp_path / "out")}
    entry = B.grade_task(task)
    assert [p.parent for p in (tmp_path / "out").iterdir()] == [tmp_path / "out"]
    assert Path(entry["html"]).parent == (tmp_path / "html").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html", "out"]


# ---------------------------------------------------------------------------------------------
# summary.csv
# ---------------------------------------------------------------------------------------------


def test_no_summary_cell_is_a_formula(tmp_path):
    starts = ["=HYPERLINK(\"http://x\",\"click\")", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1", "\n=1", " =1"]
    entries = [{"student": s, "notebook": f"{s}.ipynb", "score": 1.0, "max_score": 1.0, "flags": [s, "ok"],
                "integrity": [s], "errors": [s + "\n=cmd|' /C calc'!A0"], "duration_s": 1.5} for s in starts]
    entries.append({"student": "honest", "notebook": "00_setup/00_setup.ipynb", "score": 3.0, "max_score": 3.0,
                    "flags": [], "integrity": [], "errors": [], "duration_s": 20.1})
    path = tmp_path / "summary.csv"
    B.write_summary(path, entries)
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) == len(entries) + 1, "a line break inside a cell made a new line"
    rows = list(csv.reader(text.splitlines()))
    assert rows[0] == B.SUMMARY_COLUMNS
    for row in rows[1:]:
        for cell in row:
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r", "\n"), row
            assert cell.lstrip()[:1] not in ("=", "+", "-", "@"), row
    assert ["honest", "00_setup/00_setup.ipynb", "3", "3", "", "", "", "20.1"] in rows
    assert any(row[0] == "'=HYPERLINK(\"http://x\",\"click\")" for row in rows)
    assert any("\\n=cmd" in row[6] for row in rows), "a line break is kept, written as an escape"


# ---------------------------------------------------------------------------------------------
# Symbolic links
# ---------------------------------------------------------------------------------------------


def test_symbolic_links_are_refused_by_name_and_never_followed(course):
    honest = submit("alice", "easy", "easy.ipynb")
    roots = [Path("submitted")]
    assert B.symlink_refusal(honest, roots) is None
    # a data file next to the notebook pointing at the answer key
    eve = submit("eve", "easy", "easy.ipynb")
    (eve.parent / "data.txt").symlink_to(Path("../../../key.txt"))
    assert B.symlink_refusal(eve, roots).startswith("submitted/eve/easy/data.txt is a symbolic link: refused")
    # the notebook itself
    (Path("submitted") / "mal" / "easy").mkdir(parents=True)
    linked = Path("submitted/mal/easy/easy.ipynb")
    linked.symlink_to(Path("../../../source/easy/easy.ipynb"))
    assert B.symlink_refusal(linked, roots).startswith("submitted/mal/easy/easy.ipynb is a symbolic link")
    # a folder on the way down
    (Path("submitted") / "trent").mkdir()
    Path("submitted/trent/easy").symlink_to(Path("../../source/easy"), target_is_directory=True)
    assert B.symlink_refusal(Path("submitted/trent/easy/easy.ipynb"), roots).startswith(
        "submitted/trent/easy is a symbolic link")
    # a notebook given by itself (a shell glob went through the linked folder): its
    # <student>/<assignment> folders are checked too
    assert B.symlink_refusal(Path("submitted/trent/easy/easy.ipynb"), [Path("submitted/trent/easy/easy.ipynb")]) \
        .startswith("submitted/trent/easy is a symbolic link")
    assert B.symlink_refusal(honest, [honest]) is None and B.symlink_refusal(Path("solo.ipynb"), []) is None
    # the folder given on the command line may itself be a link: it is the instructor's
    Path("via").symlink_to(Path("submitted"), target_is_directory=True)
    assert B.symlink_refusal(Path("via/alice/easy/easy.ipynb"), [Path("via")]) is None
    # discovery lists links as themselves and never walks into a linked folder
    found = B.find_notebooks(Path("submitted"))
    assert Path("submitted/trent/easy") in found and Path("submitted/mal/easy/easy.ipynb") in found
    assert not any(str(p).startswith("submitted/trent/easy/") for p in found)


def test_reading_a_linked_notebook_or_a_fifo_is_refused(course):
    link = Path("link.ipynb")
    link.symlink_to(Path("source/easy/easy.ipynb"))
    with pytest.raises(G.GradingRefused, match="link.ipynb is a symbolic link: refused"):
        G.read_submission(link)
    os.mkfifo("fifo.ipynb")
    with pytest.raises(G.GradingRefused, match="not a regular file"):
        G.read_submission(Path("fifo.ipynb"))  # (opening a FIFO would block: O_NONBLOCK)
    assert G.read_submission(Path("source/easy/easy.ipynb")).cells


def test_data_files_are_copied_but_a_link_among_them_refuses_the_submission(course, tmp_path):
    nb = submit("alice", "easy", "easy.ipynb")
    (nb.parent / "data.csv").write_text("1,2\n")
    (nb.parent / "torch.py").write_text("# would shadow torch")
    work = tmp_path / "work"
    work.mkdir()
    G._copy_data_files(nb, work)
    assert sorted(p.name for p in work.iterdir()) == ["data.csv"]
    (nb.parent / "data.txt").symlink_to(Path("../../../key.txt"))
    with pytest.raises(G.GradingRefused, match="alice/easy/data.txt is a symbolic link: refused"):
        G._copy_data_files(nb, tmp_path / "work2")


# ---------------------------------------------------------------------------------------------
# Which source a notebook is graded against
# ---------------------------------------------------------------------------------------------


def test_the_folder_names_the_assignment(course):
    index = G.source_index(Path("source"))
    assert sorted(index) == ["easy/easy.ipynb", "hard/hard.ipynb"]
    assert G.find_source(Path("submitted/alice/hard/hard.ipynb"), index).parent.name == "hard"
    # named after the easy one, in the hard one's folder: the folder decides
    assert G.find_source(Path("submitted/alice/hard/easy.ipynb"), index).parent.name == "hard"
    # a renamed copy in its assignment's folder (the assignment has one notebook)
    assert G.find_source(Path("submitted/alice/hard/hard-Copy1.ipynb"), index).parent.name == "hard"
    for outside in ("inbox/easy.ipynb", "inbox/alice_easy_final.ipynb", "submitted/alice/easy.ipynb"):
        source, why = G.source_lookup(Path(outside), index)
        assert source is None and why.startswith("no source notebook for this submission: its folder")
        assert "names no assignment" in why and "easy, hard" in why
    (Path("source") / "hard" / "part2.ipynb").write_text(nbformat.writes(assignment("part2")))
    source, why = G.source_lookup(Path("submitted/alice/hard/easy.ipynb"), G.source_index(Path("source")))
    assert source is None and "assignment 'hard' has no notebook named 'easy.ipynb'" in why


def test_another_assignments_notebook_is_refused():
    easy, hard = assignment("easy"), assignment("hard")
    ids = {"easy/easy.ipynb": G.answer_ids(easy), "hard/hard.ipynb": G.answer_ids(hard)}
    why = G.source_mismatch(easy, ids["hard/hard.ipynb"], "hard/hard.ipynb", ids)
    assert why.startswith("this notebook does not match hard/hard.ipynb, the assignment its folder names: 0 of its 2")
    assert "2 of 2 of easy/easy.ipynb's are" in why
    assert G.source_mismatch(hard, ids["hard/hard.ipynb"], "hard/hard.ipynb", ids) is None
    partly = new_notebook(cells=[hard.cells[0], easy.cells[1]])  # a student who pasted one cell across
    assert G.source_mismatch(partly, ids["hard/hard.ipynb"], "hard/hard.ipynb", ids) is None
    bare = new_notebook(cells=[new_code_cell("def f():\n    return 1")])  # metadata lost: graded as usual
    assert G.source_mismatch(bare, ids["hard/hard.ipynb"], "hard/hard.ipynb", ids) is None


# ---------------------------------------------------------------------------------------------
# The batch: refusals reach the JSON, the HTML and the summary; resuming finds the new names
# ---------------------------------------------------------------------------------------------


def test_a_batch_refuses_links_strays_and_impostors_without_running_them(course):
    paths = [submit("eve", "easy", "easy.ipynb"), submit("imp", "hard", "hard.ipynb", assignment("easy")),
             submit("misplaced", "hard", "easy.ipynb", assignment("easy")), submit("stray", "inbox", "easy.ipynb"),
             submit("José", "easy", "easy.ipynb"), submit("Josè", "easy", "easy.ipynb")]
    (paths[0].parent / "data.txt").symlink_to(Path("../../../key.txt"))
    for student in ("José", "Josè"):  # refused too, each on its own (a link next to each)
        (Path("submitted") / student / "easy" / "notes.txt").symlink_to(Path("../../../key.txt"))
    kwargs = dict(roots=[Path("submitted")], source_dir=Path("source"), timeout=10, html_dir=Path("html"),
                  kernel_name="python3", jobs=1, guard=True, sandbox=False, budget_s=60, max_bytes=1 << 20,
                  out_dir=Path("results"), progress=False)
    result = B.run_batch(paths, **kwargs)
    by = {nb["student"]: nb for nb in result["notebooks"]}
    assert by["eve"]["errors"] == [
        "submitted/eve/easy/data.txt is a symbolic link: refused (a submission's files and folders are never "
        "followed out of it: hand in the files themselves)"]
    assert "does not match hard/hard.ipynb" in by["imp"]["errors"][0] and by["imp"]["max_score"] == 2
    assert "does not match hard/hard.ipynb" in by["misplaced"]["errors"][0]
    assert "names no assignment" in by["stray"]["errors"][0]
    assert all(nb["score"] == 0 and "sandbox" not in nb for nb in result["notebooks"]), "nothing was run"
    assert by["José"]["html"] != by["Josè"]["html"]
    assert len(list(Path("results").glob("*.json"))) == len(paths) == len(list(Path("html").glob("*.html")))
    everything = "".join(p.read_text() for p in [*Path("results").iterdir(), *Path("html").iterdir()])
    assert KEY_TEXT not in everything and "key.txt" not in everything
    # resuming: the impostor's result (a file and a source: resumable) is taken from its JSON
    name = B.result_name("imp", "hard/hard.ipynb")
    saved = json.loads((Path("results") / name).read_text())
    saved["notes"] = ["taken from the previous run"]
    (Path("results") / name).write_text(json.dumps(saved))
    again = {nb["student"]: nb for nb in B.run_batch(paths, **kwargs)["notebooks"]}
    assert again["imp"]["notes"] == ["taken from the previous run"]
