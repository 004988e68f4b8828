"""The HTML feedback page renders every piece of student text inert (no kernel needed).

A page is built from hostile outputs and names (a script in an image/png output that breaks out of
the src attribute, an HTML output, an SVG, markup in streams, tracebacks, markdown, file names,
flags, feedback, copies) and then parsed: only the grader's own tags may appear, no attribute is
an event handler, every image is a data URI of checked PNG/JPEG bytes, and a strict CSP is set.
"""
from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.feedback_html import CSP, _CSS, image_data_uri, render_html
from autograder.grade import render_html as render_html_from_grade

SCRIPT = "<script>alert(1)</script>"
BREAKOUT = "x' onerror='alert(1)"
ATTR = "\"'><img src=x onerror=alert(2)>"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(30))
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "b", "table", "tr", "th", "td",
                "div", "pre", "img"}


class Tags(HTMLParser):
    """Every start tag of a page, with its attributes."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parsed(page: str) -> list[tuple[str, dict]]:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser.tags


def display(data: dict):
    return new_output("display_data", data=data)


def entry_for(path="sub/alice/00_setup/00_setup.ipynb", **extra):
    entry = {"path": path, "score": 1.0, "max_score": 3.0, "cells": [], "integrity": [], "flags": [],
             "errors": []}
    entry.update(extra)
    return entry


def hostile_notebook():
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(f"# notes {SCRIPT} {ATTR}"),
        new_code_cell("print('hi')", outputs=[
            display({"image/png": BREAKOUT}),
            display({"image/png": base64.b64encode(PNG).decode() + SCRIPT}),
            display({"image/png": base64.b64encode(b"<svg onload=alert(3)>").decode()}),
            display({"image/jpeg": "\n".join(re.findall(".{1,20}", base64.b64encode(JPEG).decode()))}),
            display({"text/html": SCRIPT, "text/plain": f"plain {SCRIPT}"}),
            display({"image/svg+xml": f"<svg onload='alert(4)'>{SCRIPT}</svg>"}),
            display({"application/javascript": "alert(5)", f"text/{SCRIPT}": "x"}),
            new_output("stream", name="stdout", text=f"out {SCRIPT} {ATTR}"),
            new_output("error", ename="ValueError", evalue=SCRIPT, traceback=[f"\x1b[31m{SCRIPT}\x1b[0m", ATTR]),
            new_output("execute_result", data={"text/plain": ATTR}, execution_count=1),
        ]),
        new_code_cell(f"x = '{SCRIPT}'"),
    ]
    # hostile shapes: a sandbox may hand back any JSON at all
    nb.cells[2]["outputs"] = [{"output_type": "display_data", "data": "not a dict"}, "not an output",
                              {"output_type": "stream", "text": 12}, {"output_type": "error", "traceback": "x"},
                              {"output_type": "display_data", "data": {"image/png": ["iVBOR", 3]}}]
    return nb


def hostile_entry():
    return entry_for(path=f"sub/{SCRIPT}/00/{ATTR}.ipynb", flags=[f"flag {SCRIPT}"], integrity=[f"i {ATTR}"],
                     errors=[f"e {SCRIPT}"],
                     cells=[{"grade_id": ATTR, "score": 0.0, "max_score": 1.0, "passed": False, "status": SCRIPT,
                             "feedback": f"AssertionError: got {SCRIPT}"}],
                     copies=[{"where": f"cell 3 {SCRIPT}", "student_code": f"def f():\n    return '{SCRIPT}'",
                              "matched": f"bob {ATTR}", "matched_code": "def g():\n    return 1 < 2 > 0"},
                             "not a dict", {"where": 5}])


def test_hostile_text_comes_out_as_text_and_nothing_else():
    page = render_html(hostile_entry(), hostile_notebook())
    assert "<script" not in page.lower() and "<svg" not in page.lower()
    tags = parsed(page)
    assert {tag for tag, _ in tags} <= ALLOWED_TAGS, {tag for tag, _ in tags} - ALLOWED_TAGS
    for tag, attrs in tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        assert set(attrs) <= {"charset", "http-equiv", "content", "class", "lang", "alt", "src"}, (tag, attrs)
        if "src" in attrs:
            assert tag == "img" and re.fullmatch(r"data:image/(png|jpeg);base64,[A-Za-z0-9+/]+=*", attrs["src"]), attrs
    # the student's text is all there, escaped
    for shown in ("&lt;script&gt;alert(1)&lt;/script&gt;", "x = &#x27;&lt;script&gt;", "onerror=alert(2)"):
        assert shown in page


def test_images_are_only_checked_png_or_jpeg_bytes_reencoded():
    assert image_data_uri("image/png", BREAKOUT) is None
    assert image_data_uri("image/png", base64.b64encode(PNG).decode() + "'") is None
    assert image_data_uri("image/png", base64.b64encode(b"<svg/>").decode()) is None
    assert image_data_uri("image/svg+xml", base64.b64encode(PNG).decode()) is None
    assert image_data_uri("image/png", ["iVBOR", 3]) is None
    wrapped = "\n".join(re.findall(".{1,10}", base64.b64encode(PNG).decode()))
    assert image_data_uri("image/png", wrapped) == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert image_data_uri("image/jpeg", base64.b64encode(JPEG).decode()).startswith("data:image/jpeg;base64,/9j/")
    page = render_html(hostile_entry(), hostile_notebook())
    srcs = [attrs["src"] for tag, attrs in parsed(page) if tag == "img"]
    assert srcs == ["data:image/jpeg;base64," + base64.b64encode(JPEG).decode()], srcs


def test_rich_outputs_are_not_rendered_and_say_so():
    page = render_html(entry_for(), hostile_notebook())
    assert "plain &lt;script&gt;" in page, "an HTML output's text/plain is shown, escaped"
    assert "not rendered: text/html" in page and "image/svg+xml" in page and "application/javascript" in page
    assert "<svg" not in page


def test_a_strict_content_security_policy_comes_first():
    page = render_html(entry_for(), new_notebook())
    head = page[:page.index("<title>")]
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in head
    rules = dict(rule.strip().split(" ", 1) for rule in CSP.split(";"))
    assert rules["default-src"] == "'none'" and rules["img-src"] == "data:" and "script-src" not in rules
    digest = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
    assert rules["style-src"] == f"'sha256-{digest}'" and f"<style>{_CSS}</style>" in page
    assert "unsafe" not in CSP


def test_copies_are_shown_side_by_side_escaped():
    page = render_html(hostile_entry(), None)
    assert "Possible copies" in page and "<div class=pair>" in page
    assert "return &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27;" in page and "return 1 &lt; 2 &gt; 0" in page
    assert "bob &quot;&#x27;&gt;&lt;img" in page


def test_hidden_test_lines_are_still_blanked_and_the_name_is_importable_from_grade():
    nb = new_notebook(cells=[new_code_cell("print(1)", outputs=[
        new_output("stream", name="stdout", text="check_x(impl, seed=12345)\n")])])
    nb.metadata["autograder"] = {"hidden_lines": ["check_x(impl, seed=12345)"]}
    page = render_html_from_grade(entry_for(), nbformat.from_dict(nb))
    assert "seed=12345" not in page and "[hidden test]" in page
