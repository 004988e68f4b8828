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

On the grader before this fix each of the four earned full marks with no flag. The seventh red team
then found, each with full marks and no flag:

- a function made by hand from the code of course_lib's (`types.FunctionType(f.__code__.replace(), {})`,
  course_lib's function picked out of its module without naming it): 0 (an audit hook sees every function
  made by hand; a later block finds such copies on the heap, by file or by bytecode, and wires them);
- the wire's own stand-in (what the wire calls, in the module's globals while a block is open), kept
  from the first call and called through `unittest.mock`: 0 (the stand-in notes every call itself;
  the copy of the original it runs is out of reach in its closure);
- an honest answer followed by a table keyed by the exercise's name (`row["kv_bytes_per_token"] = ...`):
  full marks and no flag (a name looked up by a string is flagged only when what it fetches is called).

The ninth red team got full marks and no flag (on notebook 01's loops) with a function of its own whose
nested placeholder `def` had its code swapped for course_lib's (`code.replace(co_consts=...)`), its file
relabelled as an unwatched course_lib file: each call makes a function of course_lib's code, with no audit
event. Now 0: the function made by hand is seen to nest another file's code, and later blocks find the
functions holding such code and wire them. The tenth red team then got full marks, no flag, with:

- course_lib's file copied to a new module file and imported (a module run once, under another path):
  still full marks (docs/grading.md, "What remains possible": compiled from source, it cannot be told from
  an honest answer that compiles to the same bytecode, as the answer key does), but flagged for review
  (the import path changed);
- course_lib's code with a global renamed (`int` -> `int_`, the globals map it back), relabelled to the
  cell's file: now 0 (a function longer than a line is a copy by its bytecode, whatever its names);
- the host of the ninth red team built from `marshal` bytes before any check ran (no `code.__new__`, and no
  watched bytecode known yet): now 0 (course_lib's bytecode is known from the start).
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


_MADE_BY_HAND = '''import types
import course_lib.model.kv_footprint
_ns = vars(course_lib.model).get("kv_footprint")
_ref = [v for v in vars(_ns).values() if isinstance(v, types.FunctionType)][0]
_copy = types.FunctionType(getattr(_ref, "__code__").replace(), {})


def kv_bytes_per_token(config, bytes_per_elem):
    return _copy(config, bytes_per_elem)
'''

_STAND_IN_KEPT = '''from unittest import mock
import course_lib.model.kv_footprint
_g = vars(vars(course_lib.model).get("kv_footprint"))
_cache = []


def kv_bytes_per_token(config, bytes_per_elem):
    if not _cache:
        _cache.extend(v[1] for k, v in list(_g.items()) if k.startswith("__ag_trip"))
    if not _cache:
        return -1
    return mock.Mock(side_effect=_cache[0])(config, bytes_per_elem)
'''

# What the hand-made copies below share: course_lib's function's code taken without naming `__code__`, and a
# host whose nested placeholder `def` can be swapped for another code object.
_CODE_AND_HOST = '''import inspect
import marshal
import types
import course_lib.model.kv_footprint as _k


def _code(f):
    return next(v for _, v in inspect.getmembers(f) if isinstance(v, types.CodeType))


def _host(config, bytes_per_elem):
    def placeholder():
        pass

    return placeholder(config, bytes_per_elem)
'''

_HELD_IN_CONSTANTS = _CODE_AND_HOST + '''

_theirs, _h = _code(_k.kv_bytes_per_token), _code(_host)
_made = types.FunctionType(
    _h.replace(co_consts=tuple(_theirs if isinstance(c, types.CodeType) else c for c in _h.co_consts),
               co_filename=_theirs.co_filename.replace("model/kv_footprint.py", "course.py")),
    dict(vars(_k)))


def kv_bytes_per_token(config, bytes_per_elem):
    return _made(config, bytes_per_elem)
'''

_FILE_COPY = '''import os
import sys
import tempfile
import course_lib.model.kv_footprint as _k

_d = tempfile.mkdtemp()
with open(_k.__file__) as _f:
    _text = _f.read()
with open(os.path.join(_d, "my_footprint.py"), "w") as _f:
    _f.write(_text)
sys.path.insert(0, _d)
import my_footprint


def kv_bytes_per_token(config, bytes_per_elem):
    return my_footprint.kv_bytes_per_token(config, bytes_per_elem)
'''

_NAMES_CHANGED = _CODE_AND_HOST + '''

_theirs = _code(vars(_k)["kv_bytes_per_token"])
_mine = types.FunctionType(
    _theirs.replace(co_names=tuple("int_" if n == "int" else n for n in _theirs.co_names),
                    co_filename=_code(lambda: 0).co_filename),
    {"int_": int})


def kv_bytes_per_token(config, bytes_per_elem):
    return _mine(config, bytes_per_elem)
'''

_MARSHALLED_HOST = _CODE_AND_HOST + '''

def _build():
    theirs, host = _code(vars(_k)["kv_bytes_per_token"]), _code(_host)
    place = next(c for c in host.co_consts if isinstance(c, types.CodeType))
    body = marshal.dumps(theirs, 2).replace(marshal.dumps(theirs.co_filename, 2), marshal.dumps(host.co_filename, 2))
    spliced = marshal.dumps(host, 2).replace(marshal.dumps(place, 2), body)
    return types.FunctionType(marshal.loads(spliced), globals(), "kv")


_mine = _build()


def kv_bytes_per_token(config, bytes_per_elem):
    return _mine(config, bytes_per_elem)
'''

_HONEST_TABLE = '''def kv_bytes_per_token(config, bytes_per_elem):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem


row = {}
row["kv_bytes_per_token"] = 4
print(row["kv_bytes_per_token"])
'''


def _answer(student: str, code: str, expect) -> AttackCase:
    """00's trimmed notebook with `code` in the answer cell, graded as `student`; `expect(entry)` judges
    its entry of the batch."""
    return AttackCase(student, lambda b: [b.write(student, b.attack(code))], lambda graded: expect(graded.by[student]))


def _refused(*flags):
    def expect(entry):
        assert entry["max_score"] == MAX and entry["score"] == 0, (entry["score"], entry["cells"])
        for flag in flags:
            assert any(flag in f for f in entry["flags"]), (flag, entry["flags"])
    return expect


def _flagged(*flags):
    def expect(entry):
        for flag in flags:
            assert any(flag in f for f in entry["flags"]), (flag, entry["flags"])
    return expect


def _flagged_for_review(entry):
    for flag in ("uses course_lib.model.kv_footprint.kv_bytes_per_token", "spells 'autograder' out of pieces"):
        assert any(flag in f for f in entry["flags"]), (flag, entry["flags"])


def _full_marks_and_no_flag(entry):
    assert entry["score"] == MAX and not entry["flags"] and not entry["copies"], (entry["score"], entry["flags"])


CASES = [
    _answer("rt6_runpy_copy", _RUNPY_COPY, _refused("looks up 'kv_bytes_per_token' by its name")),
    _answer("rt6_reload_in_the_answer", _RELOAD_IN_THE_ANSWER, _refused("spells 'importlib' out of pieces")),
    _answer("rt6_another_module", _ANOTHER_MODULE, _refused()),
    _answer("rt6_wires_undone", _WIRES_UNDONE, _flagged_for_review),
    _answer("rt7_made_by_hand", _MADE_BY_HAND, _refused("spells '__code__' in a string")),
    _answer("rt7_stand_in_kept", _STAND_IN_KEPT, _refused()),
    _answer("rt7_honest_table", _HONEST_TABLE, _full_marks_and_no_flag),
    _answer("rt9_held_in_constants", _HELD_IN_CONSTANTS, _refused()),
    _answer("rt10_file_copy", _FILE_COPY, _flagged("changes where imports are found", "makes a temporary folder")),
    _answer("rt10_names_changed", _NAMES_CHANGED, _refused()),
    _answer("rt10_marshalled_host", _MARSHALLED_HOST, _refused()),
]
