"""What the sixth red team found: course_lib's formula reached without calling the function the trip
wires watch. Each a right answer built from course_lib's code, graded in the batch:

- a copy of course_lib's module made with `runpy.run_path` of its file when the cell runs (before
  any check, so the recording's `gc.freeze()` hides the copy from a scan of the heap): 0 (the copy's
  module code ran a second time: a later block looks its functions up, frozen ones too, and wires
  them), and flagged (the copy's function is looked up by its name);
- the module reloaded inside the answer (`importlib` reached through `sys.modules` by a name spelled
  in pieces): 0 (the audit hook sees the watched file's code run inside the block), and flagged;
- the same formula through another course_lib module (`course_lib.sim.hardware.ModelShape`): 0 (it
  now calls kv_footprint's function rather than holding a second copy of the formula);
- the trip wires' list of open blocks emptied around a plain call: the points stand (code running in
  the kernel can undo anything the kernel notes: the trip wires are a review aid, see
  autograder/call_tripwire.py), but the notebook is flagged twice for review (the counterpart's
  module imported under another name, and names spelled out of pieces).

On the grader before this fix each of the four earned full marks with no flag.
"""
from __future__ import annotations

from attack_cases import MAX, AttackCase

_RUNPY_COPY = '''import os, runpy
import course_lib.model as _m
_ns = runpy.run_path(os.path.join(os.path.dirname(_m.__file__), "kv_footprint.py"))


def kv_bytes_per_token(config, bytes_per_elem):
    return _ns["kv_bytes_per_token"](config, bytes_per_elem)
'''

_RELOAD_IN_THE_ANSWER = '''import sys as _sys
import course_lib.model.kv_footprint as _k


def kv_bytes_per_token(config, bytes_per_elem):
    _il = getattr(_sys, "mod" + "ules")["import" + "lib"]
    return _il.reload(_k).kv_bytes_per_token(config, bytes_per_elem)
'''

_ANOTHER_MODULE = '''from course_lib.sim.hardware import ModelShape


def kv_bytes_per_token(config, bytes_per_elem):
    return ModelShape("x", 0.0, config.num_layers, 1, 1, config.num_kv_heads, config.head_dim,
                      kv_bytes_per_elem=bytes_per_elem).kv_bytes_per_token
'''

_WIRES_UNDONE = '''import sys as _sys
from course_lib.model import kv_footprint as _k


def kv_bytes_per_token(config, bytes_per_elem):
    _w = getattr(getattr(_sys, "mod" + "ules")["auto" + "grader.call_tripwire"], "_watchers")
    _saved = list(_w)
    _w.clear()
    try:
        return _k.kv_bytes_per_token(config, bytes_per_elem)
    finally:
        _w.extend(_saved)
'''


def _refused(student, *flags):
    def expect(graded):
        entry = graded.by[student]
        assert entry["max_score"] == MAX and entry["score"] == 0, (entry["score"], entry["cells"])
        for flag in flags:
            assert any(flag in f for f in entry["flags"]), (flag, entry["flags"])
    return expect


def _flagged_for_review(graded):
    entry = graded.by["rt6_wires_undone"]
    for flag in ("uses course_lib.model.kv_footprint.kv_bytes_per_token", "spells 'autograder' out of pieces"):
        assert any(flag in f for f in entry["flags"]), (flag, entry["flags"])


CASES = [
    AttackCase("rt6_runpy_copy", lambda b: [b.write("rt6_runpy_copy", b.attack(_RUNPY_COPY))],
               _refused("rt6_runpy_copy", "looks up 'kv_bytes_per_token' by its name")),
    AttackCase("rt6_reload_in_the_answer", lambda b: [b.write("rt6_reload_in_the_answer", b.attack(_RELOAD_IN_THE_ANSWER))],
               _refused("rt6_reload_in_the_answer", "spells 'importlib' out of pieces")),
    AttackCase("rt6_another_module", lambda b: [b.write("rt6_another_module", b.attack(_ANOTHER_MODULE))],
               _refused("rt6_another_module")),
    AttackCase("rt6_wires_undone", lambda b: [b.write("rt6_wires_undone", b.attack(_WIRES_UNDONE))],
               _flagged_for_review),
]
