"""Area "runner" (red team round 11): the grader's own code in the sandbox, and what the scan reads.

- a `json.py` handed in beside the notebook: the runner (`python -m autograder.sandbox_exec`) used to
  start in /work, the student's folder, which `-m` puts first on `sys.path`, so the runner's
  `import json` ran the student's file before the runner guarded anything (it read the notebook,
  hidden tests and the seed key's seeds included, and could rewrite it). Here the file ends the
  runner (exit status 3) when the runner imports it, and is the standard library's `json` anywhere
  else (the kernel, which runs in /work, imports it too): an honest answer beside it must keep its
  full marks.
- a copy of an instructor cell with a "hidden tests" block of the student's own: the scan skipped
  any student cell whose text *without its hidden blocks* matched an instructor cell, so the code in
  the block (course_lib's formula called with the trip wires emptied) was never scanned: full marks,
  no flag. Its reference to the autograder must zero the notebook, as the same code does in a plain cell.
- the same code in a `helper.py` handed in beside the notebook, the answer cell only importing it:
  the scan reads the notebook's cells, never such a file (red team round 11b: full marks, no flag).
  Python files are no longer copied beside the notebook (graded code lives in its cells), so the
  import fails: 0. (The `json.py` of the first case is not copied either now; the runner starting in
  /job, tests/test_sandbox_disk.py, holds it on its own.)
- an honest answer that reads a data file handed in beside the notebook: the file still reaches the
  notebook's folder (the sandbox's own /work now, the runner copies it in) and is writable there.

Each attack got full marks (the first: 0, the runner ended) on the grader before this area's fix.
"""
from __future__ import annotations

from . import MAX, PREAMBLE, AttackCase

SHADOW_JSON = '''"""A student's json.py: in the grader's runner it ends the runner; anywhere else it is the real json."""
import os
import sys

if sys.argv and sys.argv[0].endswith("sandbox_exec.py"):
    os._exit(3)
_here = os.path.dirname(os.path.abspath(__file__))
_path = list(sys.path)
sys.path[:] = [p for p in _path if os.path.abspath(p or os.curdir) != _here]
del sys.modules[__name__]
import json as _json  # noqa: E402 (the standard library's)

sys.path[:] = _path
sys.modules[__name__] = _json
'''

WIRES_CLEARED = '''
### BEGIN HIDDEN TESTS
import course_lib.model.kv_footprint as _k
import autograder.call_tripwire as _ct


def kv_bytes_per_token(config, bytes_per_elem):
    _saved = list(_ct._watchers)
    _ct._watchers.clear()
    try:
        return _k.kv_bytes_per_token(config, bytes_per_elem)
    finally:
        _ct._watchers.extend(_saved)
### END HIDDEN TESTS
'''


HELPER = WIRES_CLEARED.replace("### BEGIN HIDDEN TESTS\n", "").replace("### END HIDDEN TESTS\n", "")

READS_DATA = '''def kv_bytes_per_token(config, bytes_per_elem):
    with open("factor.txt") as f:
        factor = int(f.read())
    with open("factor.txt", "a") as f:  # the notebook's own copy: writable
        f.write("\\n")
    return factor * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
'''


def _build_helper(builder):
    path = builder.write("rt11_helper_module", builder.attack("from helper import kv_bytes_per_token\n"))
    (path.parent / "helper.py").write_text(HELPER)
    return [path]


def _build_data(builder):
    path = builder.write("rt11_data_file_reaches_the_notebook", builder.attack(READS_DATA))
    (path.parent / "factor.txt").write_text("2")
    return [path]


def _expect_score(student, score):
    def expect(graded):
        entry = graded.by[student]
        assert entry["score"] == score, (entry["score"], entry["errors"], entry["integrity"], entry["flags"])
    return expect


def _build_shadow(builder):
    path = builder.write("rt11_json_py_beside_the_notebook", builder.honest())
    (path.parent / "json.py").write_text(SHADOW_JSON)
    return [path]


def _expect_full_marks(graded):
    _expect_score("rt11_json_py_beside_the_notebook", MAX)(graded)
    errors = graded.by["rt11_json_py_beside_the_notebook"]["errors"]
    assert not any("exited with status" in e for e in errors), errors


def _expect_scanned(graded):
    entry = graded.by["rt11_hidden_block_in_an_instructor_cell"]
    assert entry["score"] == 0, (entry["score"], entry["integrity"], entry["flags"])
    assert any("autograder" in i for i in entry["integrity"]), entry["integrity"]


CASES = [
    AttackCase("rt11_json_py_beside_the_notebook", _build_shadow, _expect_full_marks),
    AttackCase("rt11_hidden_block_in_an_instructor_cell",
               lambda b: [b.write("rt11_hidden_block_in_an_instructor_cell", b.attack(PREAMBLE + WIRES_CLEARED))],
               _expect_scanned),
    AttackCase("rt11_helper_module", _build_helper, _expect_score("rt11_helper_module", 0)),
    AttackCase("rt11_data_file_reaches_the_notebook", _build_data, _expect_score("rt11_data_file_reaches_the_notebook", MAX),
               honest=True),
]
