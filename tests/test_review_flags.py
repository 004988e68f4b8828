"""Review flags from the student's own code (no kernel): ways round the scan and the call bans that
the red team used (issue 26's round: a course_lib module imported under another name, its function
looked up by a string, a refused name spelled out of pieces), and honest notebooks raising none."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from autograder.counterpart_refs import counterpart_references
from autograder.scan import review_flags

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code, flag", [
    ("from course_lib.model import kv_footprint as k\ndef f(c, b):\n    return k.kv_bytes_per_token(c, b)\n",
     "uses course_lib.model.kv_footprint.kv_bytes_per_token"),
    ("import runpy\nns = runpy.run_path('x.py')\ndef f(c, b):\n    return ns['kv_bytes_per_token'](c, b)\n",
     "looks up 'kv_bytes_per_token' by its name"),
    ("def f(m, e):\n    return getattr(m, 'preemption_report')(e)\n", "looks up 'preemption_report' by its name"),
])
def test_a_counterpart_reached_another_way_is_flagged(code, flag):
    found = counterpart_references([(3, code)])
    assert any(flag in f and f.startswith("cell 3:") for f in found), found


@pytest.mark.parametrize("code, name", [
    ("import sys\nm = getattr(sys, 'mod' + 'ules')\n", "modules"),
    ("m = sys_modules['auto' + 'grader.call_tripwire']\n", "autograder"),
    ("il = ''.join(['import', 'lib'])\n", "importlib"),
    ("x = 'f_' + 'back'\n", "f_back"),
    ("c = getattr(f, '__edoc__'[::-1])\n", "__code__"),
])
def test_a_refused_name_spelled_out_of_pieces_is_flagged(code, name):
    assert any(f"spells {name!r} out of pieces" in f for f in review_flags(code)), review_flags(code)


@pytest.mark.parametrize("code, name", [
    ("c = getattr(f, '__code__')\n", "__code__"),
    ("m = mods['autograder.checks.nb07_admission_control']\n", "autograder"),
    ("m = getattr(sys, 'modules')\n", "modules"),
])
def test_a_refused_name_written_as_a_whole_string_is_flagged(code, name):
    assert any(f"spells {name!r} in a string" in f for f in review_flags(code)), review_flags(code)


def test_ordinary_strings_are_not_flagged():
    code = ("label = 'tokens' + '/s'\nprint('the ' + 'autograder' + ' runs this')\nrow = {'answer': 1}\n"
            "x = row['answer'] + len('mod' + 'el')\nprint('the autograder checks this')\n"
            "summary = {'modules': 3, 'builtins': 'none', 'autograder': 'not me'}\nprint('modules', '__code__')\n"
            "for key in ('modules', 'builtins'):\n    print(summary[key], summary['modules'])\n")
    assert review_flags(code) == []
    table = "row = {}\nrow['kv_bytes_per_token'] = 4\nprint(row['kv_bytes_per_token'], row['answer'])\n"
    assert counterpart_references([(0, table)]) == []


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "data" / "blind_honest").glob("*/*/*.ipynb")),
                         ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_honest_notebooks_raise_none_of_these_flags(path):
    assignment = path.parent.name
    released = nbformat.read(ROOT / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    given = "\n".join(c.source for c in released.cells if c.cell_type == "code")
    cells = [(i, c.source) for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == "code"]
    assert counterpart_references(cells, given) == []
    assert not [f for _, source in cells for f in review_flags(source) if " spells " in f]


def test_a_module_path_of_ones_own_is_flagged_and_os_path_is_not():
    """A copy of course_lib's file imported from a folder of one's own (the tenth red team) runs once, as an
    honest module would: the trip wires cannot see it, so what it needs is flagged for review."""
    copy = "import sys, tempfile\n_d = tempfile.mkdtemp()\nsys.path.insert(0, _d)\n"
    flags = review_flags(copy)
    assert any("changes where imports are found" in f for f in flags), flags
    assert any("makes a temporary folder" in f for f in flags), flags
    assert review_flags("import os\nprint(os.path.join('a', 'b'), os.sep)\n") == []
