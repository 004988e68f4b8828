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

Both got full marks (the first: 0, the runner ended) on the grader before this area's fix.
"""
from __future__ import annotations

from . import KV, MAX, PREAMBLE, AttackCase

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


def _build_shadow(builder):
    path = builder.write("rt11_json_py_beside_the_notebook", builder.honest())
    (path.parent / "json.py").write_text(SHADOW_JSON)
    return [path]


def _expect_full_marks(graded):
    entry = graded.by["rt11_json_py_beside_the_notebook"]
    assert entry["score"] == MAX, (entry["score"], entry["errors"], entry["cells"])
    assert not any("exited with status" in e for e in entry["errors"]), entry["errors"]


def _expect_scanned(graded):
    entry = graded.by["rt11_hidden_block_in_an_instructor_cell"]
    assert entry["score"] == 0, (entry["score"], entry["integrity"], entry["flags"])
    assert any("autograder" in i for i in entry["integrity"]), entry["integrity"]


CASES = [
    AttackCase("rt11_json_py_beside_the_notebook", _build_shadow, _expect_full_marks),
    AttackCase("rt11_hidden_block_in_an_instructor_cell",
               lambda b: [b.write("rt11_hidden_block_in_an_instructor_cell", b.attack(PREAMBLE + WIRES_CLEARED))],
               _expect_scanned),
]
