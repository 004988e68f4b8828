"""What a determined student can do with only the notebook they hand in, and what it earns: nothing.

Each attack class of issue 16 is one submission, built from a course solution notebook cut down to
one exercise (`solutions/00_setup`: `kv_bytes_per_token` and its test cell; for the copies,
`solutions/01_static_batching`: `pad_batch`, whose reference is big enough for a fingerprint to
mean something), so that each kernel starts and finishes quickly. Most carry a WRONG answer plus
a trick that makes the in-kernel test pass anyway (the guard neutralised, the check replaced, the
test cell's body dropped, ...): the verdict, decided by replaying the sandbox's record in the
grader, must be 0. The copies (the reference's source exec'd, the reference called from a thread
or wrapped) are right answers that must be flagged for review. All of them are graded in ONE
batch run together with honest submissions, first and last, whose grades must not move (one
submission never touches another).

The time budget and the size limit need other settings: they get a second, small run.
"""
from __future__ import annotations

import base64
import csv
import json
import secrets
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from autograder import grade as G
from autograder.submissions import released_submission, with_answer

from attack_cases import KV, MAX, PAD, ROOT, WRONG, Builder, Graded, all_cases, attack, honest, only_areas
from attack_cases import write as _write
from attack_cases import write_sources as _sources

ROUND_TWO = all_cases()  # tests/attack_cases/: one module per area of issue 23
# The first round's submissions are graded only in a full run (ATTACK_AREAS unset, as in CI); a
# development run of some areas (ATTACK_AREAS=copies) leaves them out of the batch, and their tests with them.
ROUND_ONE = pytest.mark.skipif(only_areas() is not None, reason="ATTACK_AREAS set: only those areas' cases are graded")

# Neutralise the in-kernel guard (found through the garbage collector: its snapshot compares
# nothing, its reload reloads nothing) and replace the check with one that passes everything.
# Written so that the scan sees none of it.
GC_PAYLOAD = '''_gc = __import__('g' + 'c')
_s = __import__('s' + 'ys')
for _o in getattr(_gc, 'get_' + 'objects')():
    if type(_o).__name__ == 'function' and _o.__qualname__ == 'install.<locals>.guard':
        for _c in getattr(_o, '__clo' + 'sure__') or ():
            if type(_c.cell_contents).__name__ == '_Snapshot':
                _c.cell_contents.check_and_restore = lambda: []
            elif getattr(_c.cell_contents, '__name__', '') == 'reload':
                _c.cell_contents = lambda module: module
setattr(getattr(_s, 'mod' + 'ules')['auto' + 'grader.checks.nb00_setup'], 'check_kv_bytes_per_token',
        lambda *a, **k: None)
'''

# The same, written plainly: the scan flags this, so each escape below wraps it.
PLAIN_PAYLOAD = '''import gc, sys
import autograder.checks.nb00_setup as _m
for _o in gc.get_objects():
    if type(_o).__name__ == 'function' and _o.__qualname__ == 'install.<locals>.guard':
        for _c in _o.__closure__ or ():
            if type(_c.cell_contents).__name__ == '_Snapshot':
                _c.cell_contents.check_and_restore = lambda: []
            elif getattr(_c.cell_contents, '__name__', '') == 'reload':
                _c.cell_contents = lambda module: module
_m.check_kv_bytes_per_token = lambda *a, **k: None
'''

FULL_WIDTH = str.maketrans({c: chr(ord(c) - ord("a") + ord("ａ")) for c in "abcdefghijklmnopqrstuvwxyz"})

ATTACKS = {
    # -- the verdict taken from inside the student's interpreter ---------------------------------
    "trace_hook_rewrites_locals": WRONG.replace("    return 0\n", '''    frame = getattr(_s, '_get' + 'frame')(1)
    while frame is not None:
        if frame.f_code.co_name == 'check_kv_bytes_per_token':
            frame.f_trace = _tracer
            getattr(_s, 'set' + 'trace')(_tracer)
            break
        frame = getattr(frame, 'f_' + 'back')
    return 0
''') + '''
_s = __import__('s' + 'ys')
_ct = __import__('ct' + 'ypes')


def _tracer(frame, event, arg):
    if event == 'line':
        local = getattr(frame, 'f_' + 'locals')
        if 'want' in local and 'got' in local and local['got'] != local['want']:
            local['got'] = local['want']
            _ct.pythonapi.PyFrame_LocalsToFast(_ct.py_object(frame), _ct.c_int(0))
    return _tracer
''',
    "guard_found_by_gc": WRONG + GC_PAYLOAD,
    "token_from_input_history": WRONG + '''
_ip = getattr(__import__('IPython'), 'get_' + 'ipython')()
_re = __import__('re')


def _swallow(shell, etype, value, tb, tb_offset=None):
    for gid, token in _re.findall(r"\\.done\\('([^']+)', '([0-9a-f]+)'\\)", shell.user_ns['In'][-1]):
        print(f'[autograder] {gid} ok {token}')


getattr(_ip, 'set_custom' + '_exc')((AssertionError,), _swallow)
''',
    "ast_transformer_drops_check": WRONG + '''
_ip = getattr(__import__('IPython'), 'get_' + 'ipython')()
_ast = __import__('ast')


class _Drop(_ast.NodeTransformer):
    def visit_Module(self, node):
        first = node.body[0] if node.body else None
        if (isinstance(first, _ast.Expr) and isinstance(first.value, _ast.Call)
                and getattr(first.value.func, 'id', '').startswith('__auto')):
            node.body = [first, node.body[-1]]
        return node


getattr(_ip, 'ast_' + 'transformers').append(_Drop())
''',
    "fake_module_on_checks_package": WRONG + '''
_fake = __import__('types').ModuleType('nb00_setup')
_fake.check_kv_bytes_per_token = lambda *a, **k: None
setattr(__import__('auto' + 'grader.checks', fromlist=['x']), 'nb00_setup', _fake)
''',
    "fake_guard_in_builtins": WRONG + '''
_b = __import__('built' + 'ins')
_s = __import__('s' + 'ys')


class _Guard:
    def __call__(self, grade_id=''):
        pass

    def done(self, grade_id, token):
        print(f'[autograder] {grade_id} ok {token}')


for _k in list(vars(_b)):
    if _k.startswith('__auto' + 'grader_'):
        setattr(_b, _k, _Guard())
setattr(getattr(_s, 'mod' + 'ules')['auto' + 'grader.checks.nb00_setup'], 'check_kv_bytes_per_token',
        lambda *a, **k: None)
''',
    # -- scan escapes, each carrying the plain payload ---------------------------------------------
    "scan_escape_chr": WRONG + f"exec(''.join(map(chr, {list(map(ord, PLAIN_PAYLOAD))})))\n",
    "scan_escape_base64": WRONG + f"import base64\nexec(base64.b64decode({base64.b64encode(PLAIN_PAYLOAD.encode()).decode()!r}))\n",
    "scan_escape_compile": WRONG + f"exec(compile({PLAIN_PAYLOAD!r}, 'mine.py', 'exec'))\n",
    "scan_escape_full_width": WRONG + PLAIN_PAYLOAD.replace("autograder", "autograder".translate(FULL_WIDTH))
                                                   .replace("get_objects", "get_objects".translate(FULL_WIDTH)),
    "scan_escape_magic": WRONG + "%time import gc, sys; import autograder.checks.nb00_setup as _m\n"
                         "%time [[setattr(c.cell_contents, 'check_and_restore', lambda: []) for c in (o.__closure__ or ()) "
                         "if type(c.cell_contents).__name__ == '_Snapshot'] for o in gc.get_objects() "
                         "if type(o).__name__ == 'function' and o.__qualname__ == 'install.<locals>.guard']\n"
                         "%time [[setattr(c, 'cell_contents', lambda module: module) for c in (o.__closure__ or ()) "
                         "if getattr(c.cell_contents, '__name__', '') == 'reload'] for o in gc.get_objects() "
                         "if type(o).__name__ == 'function' and o.__qualname__ == 'install.<locals>.guard']\n"
                         "%time _m.check_kv_bytes_per_token = lambda *a, **k: None\n",
}

# Copies: right answers, each flagged for review (the assignment, the answer, the evidence).
COPIES = {
    "exec_of_reference_source": (PAD, '''import inspect

import torch

from course_lib import static_batching as _sb

_ns = {"torch": torch}
exec(compile(inspect.getsource(_sb.pad_batch), "mine.py", "exec"), _ns)
pad_batch = _ns["pad_batch"]
''', "runs the same bytecode as course_lib.static_batching.pad_batch"),
    "reference_from_thread": (PAD, '''import threading

from course_lib import static_batching as _sb


def pad_batch(prompts, pad_id):
    out = []
    worker = threading.Thread(target=lambda: out.append(_sb.pad_batch(prompts, pad_id)))
    worker.start()
    worker.join()
    return out[0]
''', "course_lib.static_batching.pad_batch (another thread)"),
    "reference_wrapped_no_call_ban": (KV, '''from course_lib.model import kv_footprint as _cc


def kv_bytes_per_token(config, bytes_per_elem):
    return _cc.kv_bytes_per_token(config, bytes_per_elem)
''', "kv_footprint.kv_bytes_per_token (called by your code)"),
}

# A student's own pad_batch (the solution notebook's is the answer key itself, which is flagged).
HONEST_PAD = '''import torch


def pad_batch(prompts, pad_id):
    if not prompts:
        raise ValueError("no prompts to pad")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs a token")
    width = max(map(len, prompts))
    rows = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    real = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    return torch.tensor(rows, dtype=torch.long), torch.tensor(real, dtype=torch.bool)
'''

# A process that outlives the kernel: it rewrites what the sandbox returns, tries the grader's
# own files, and would keep running if nothing killed it (its command line carries a tag).
DETACHED_TAG = f"attack-detached-{secrets.token_hex(6)}"


def _detached(grader_paths: list[str]) -> str:
    script = f'''
import json, os, time
tag = {DETACHED_TAG!r}
end = time.time() + 120
while time.time() < end:
    for path in {grader_paths!r}:
        try:
            with open(path, "w") as f:
                f.write("{{}}")
        except OSError:
            pass
    try:
        with open("/out/status.json", "w") as f:
            json.dump({{"status": {{str(i): "ok" for i in range(10)}}, "log": ["forged by the student"]}}, f)
        with open("/out/record.jsonl", "a") as f:
            f.write(json.dumps({{"exercise": "kv_bytes_per_token", "seed": 0, "events": [], "outcome": {{"ok": True}}}}) + "\\n")
    except OSError:
        pass
    time.sleep(0.2)
'''
    return WRONG + f'''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", {script!r}, {DETACHED_TAG!r}], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''


def _rewrites_sources(paths: list[str]) -> str:
    """Empties every source notebook it can find (the grader's cache, the repository's solutions/)."""
    return WRONG + f'''
import glob, json
_empty = json.dumps({{"cells": [], "metadata": {{}}, "nbformat": 4, "nbformat_minor": 5}})
for _pattern in ["/tmp/autograde-sources-*/**/*.ipynb", "/course/../solutions/**/*.ipynb"] + {paths!r}:
    for _path in glob.glob(_pattern, recursive=True):
        try:
            with open(_path, "w") as _f:
                _f.write(_empty)
        except OSError:
            pass
'''


# Hidden tests out of the feedback: a right answer on the visible seed that notes every input it is
# given (the hidden seeds' too) and raises on the others with them in the message; later cells print
# those inputs, the notebook file, the input history. The prefixes are split in the source so that
# only an output can hold them whole.
LEAKS = '''import json as _json

_seen = []


def kv_bytes_per_token(config, bytes_per_elem):
    _seen.append([config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_elem])
    if len(_seen) > 8:
        raise ValueError('LEAK' + 'ERR:' + _json.dumps(_seen))
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
'''
LEAK_CELLS = [
    "print('LEAK' + 'INPUTS:' + _json.dumps(_seen))",
    "import base64 as _b64\ntry:\n    print('LEAK' + 'FILE:' + _b64.b64encode(open('/job/notebook.ipynb', 'rb').read()).decode())\n"
    "except OSError as e:\n    print('no notebook file', e)",
    "print('LEAK' + 'HISTORY:' + _b64.b64encode('\\n'.join(In).encode()).decode())",
    "print('LEAK' + 'PLAIN:' + '\\n'.join(In))",
]

HUGE_OUTPUT = WRONG + "for _ in range(100):\n    print('x' * 1_000_000)\n"


def _one_megabyte() -> str:
    """~1 MB of what makes naive parsers quadratic: one enormous line, deep brackets, many tiny lines."""
    return (WRONG + "_long = '" + "a(" * 150_000 + "'\n" + "_deep = " + "[" * 90 + "]" * 90 + "\n"
            + "".join(f"_x{i} = {i}  # {'(' * 20}\n" for i in range(20_000)))


def _by_student(result) -> dict:
    return {nb["student"]: nb for nb in result["notebooks"]}


def _texts(entry) -> str:
    """Everything the student is shown: the JSON entry and the HTML page."""
    page = Path(entry["html"]).read_text(encoding="utf-8") if entry.get("html") else ""
    return json.dumps(entry) + page


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every attack and the honest submissions, graded in one run (two workers)."""
    base = tmp_path_factory.mktemp("attacks")
    source_dir, sources = _sources(base)
    source = sources[KV]
    out, grades = base / "results", base / "grades.json"
    paths = [_write(base, "honest_first", honest(source))]
    if only_areas() is None:  # (ATTACK_AREAS set: a development run of some areas' cases)
        paths += [_write(base, name, attack(source, code)) for name, code in ATTACKS.items()]
        paths += [_write(base, name, attack(sources[which], code, which=which), which)
                  for name, (which, code, _) in COPIES.items()]
        paths.append(_write(base, "detached_process", attack(source, _detached([str(grades), str(out / "summary.csv")]))))
        paths.append(_write(base, "rewrites_sources", attack(source, _rewrites_sources(
            [str(source_dir / "**" / "*.ipynb"), str(ROOT / "solutions" / "**" / "*.ipynb")]))))
        paths.append(_write(base, "hidden_test_leaks", attack(source, LEAKS, LEAK_CELLS)))
        paths.append(_write(base, "output_100mb", attack(source, HUGE_OUTPUT)))
        paths.append(_write(base, "notebook_1mb", attack(source, _one_megabyte())))
    paths.append(_write(base, "honest_last", honest(source)))
    paths.append(_write(base, "honest_pad_last", with_answer(honest(sources[PAD]), PAD[1], HONEST_PAD), PAD))
    paths.append(_write(base, "released_last", released_submission(source)))
    builder = Builder(base=base, source_dir=source_dir, sources=sources)
    for case in ROUND_TWO:
        paths += case.build(builder)
    # (solutions/ itself is not compared: other people edit it while this runs; no sandbox mounts it)
    sources_before = {p: p.read_bytes() for p in source_dir.rglob("*.ipynb")}
    result = G.grade(paths, source_dir=source_dir, timeout=60, html_dir=base / "html", jobs=2, out_dir=out,
                     roots=[base / "submitted"], progress=False)
    assert {p: p.read_bytes() for p in sources_before} == sources_before, "a submission changed the sources"
    grades.write_text(json.dumps(result))
    return base, result, _by_student(result)


@pytest.fixture(scope="module")
def graded(batch):
    base, result, by = batch
    return Graded(base=base, result=result, by=by, out=base / "results", html=base / "html")


@pytest.mark.parametrize("case", ROUND_TWO, ids=[c.name for c in ROUND_TWO])
def test_round_two(graded, case):
    """Issue 23's attacks (and honest submissions), graded in the same batch."""
    case.expect(graded)


def test_honest_grades_do_not_move(batch):
    _, _, by = batch
    for name, top in (("honest_first", 1), ("honest_last", 1), ("honest_pad_last", 2)):
        assert (by[name]["score"], by[name]["max_score"]) == (top, top), by[name]
        assert not by[name]["integrity"] and not by[name]["flags"] and not by[name]["errors"], by[name]
    assert (by["released_last"]["score"], by["released_last"]["max_score"]) == (0, MAX), by["released_last"]


@ROUND_ONE
@pytest.mark.parametrize("name", [n for n in ATTACKS if n not in COPIES])
def test_trick_for_a_wrong_answer_earns_nothing(batch, name):
    entry = batch[2][name]
    assert entry["score"] == 0 and entry["max_score"] == MAX, (entry["cells"], entry["integrity"])


@ROUND_ONE
def test_full_width_identifiers_are_read_like_python_reads_them(batch):
    entry = batch[2]["scan_escape_full_width"]
    assert any("refers to the autograder" in i for i in entry["integrity"]), entry["integrity"]


# A function that merely calls course_lib's formula: once flagged only (nb00's check had no call ban), now
# refused by the verdict itself, as every check with a function counterpart does
# (tests/test_exercise_roundtrip.py): no credit, and the cell says why.
REFUSED_COPIES = {"reference_wrapped_no_call_ban"}


@ROUND_ONE
@pytest.mark.parametrize("name", list(COPIES))
def test_copies_of_the_reference_are_flagged_with_evidence(batch, name):
    base, _, by = batch
    entry = by[name]
    if name in REFUSED_COPIES:
        assert entry["score"] < entry["max_score"], entry
        assert "course_lib's reference" in json.dumps(entry["cells"]), entry["cells"]
        return
    evidence = COPIES[name][2]
    assert any(evidence in f for f in entry["flags"]), entry["flags"]
    rows = {r["student"]: r for r in csv.DictReader(open(base / "results" / "summary.csv", encoding="utf-8"))}
    assert evidence in rows[name]["flags"], "the summary shows the flag too"


@ROUND_ONE
def test_a_detached_process_dies_with_its_sandbox_and_changes_nothing(batch):
    base, result, by = batch
    assert by["detached_process"]["score"] == 0
    assert json.loads((base / "grades.json").read_text()) == result, "the grader's JSON is the grader's"
    assert (base / "results" / "summary.csv").read_text().startswith("student,")
    survivors = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and DETACHED_TAG.encode() in (proc / "cmdline").read_bytes():
                survivors.append(proc.name)
        except OSError:
            continue
    assert not survivors, f"processes the submission started outlived its grading: {survivors}"
    assert not any("forged by the student" in e for e in by["detached_process"]["errors"])


@ROUND_ONE
def test_rewriting_the_sources_changes_no_other_grade(batch):
    """(The fixture checks that the sources' files are unchanged.)"""
    _, _, by = batch
    assert by["rewrites_sources"]["score"] == 0
    # graded after it (and alongside): still against the real tests
    assert by["released_last"]["max_score"] == MAX and by["honest_last"]["score"] == MAX


@ROUND_ONE
def test_feedback_never_shows_hidden_tests_or_their_inputs(batch):
    base, _, by = batch
    entry = by["hidden_test_leaks"]
    shown = _texts(entry)
    assert entry["score"] == 0, "the hidden seeds fail (the answer raises on them)"
    assert "LEAKERR:" not in shown and "LEAKINPUTS:" not in shown and "LEAKFILE:" not in shown
    assert "LEAKHISTORY:" not in shown and "LEAKPLAIN:" not in shown
    assert "seed=1)" not in shown and "seed=2)" not in shown, "the hidden check calls themselves"
    hidden = "checks.check_kv_bytes_per_token(kv_bytes_per_token, seed=1)"
    assert base64.b64encode(hidden.encode()).decode()[:24] not in shown
    page = _texts(by["honest_last"])
    assert "seed=1)" not in page and "BEGIN HIDDEN" not in page


@ROUND_ONE
def test_a_huge_output_is_capped(batch):
    base, _, by = batch
    entry = by["output_100mb"]
    assert entry["score"] == 0
    assert Path(entry["html"]).stat().st_size < 1_000_000
    assert "output cut" in Path(entry["html"]).read_text(encoding="utf-8")


@ROUND_ONE
def test_a_one_megabyte_notebook_is_graded(batch):
    entry = batch[2]["notebook_1mb"]
    assert entry["score"] == 0 and entry["max_score"] == MAX and entry["cells"][0]["status"] != "not_run", entry


# ---------------------------------------------------------------------------------------------
# Limits: the time budget and the size limit (a run of their own: other settings)
# ---------------------------------------------------------------------------------------------

BUDGET_S = 40
CELL_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def limits(tmp_path_factory):
    base = tmp_path_factory.mktemp("limits")
    source_dir, sources = _sources(base)
    source = sources[KV]
    hanging = attack(source, WRONG)
    # Before the test cell (cells past the last test are not run at all): each hangs to its cell
    # timeout, and together they spend the notebook's budget before the test cell's turn.
    hanging.cells[1:1] = [new_code_cell("while True:\n    pass") for _ in range(40)]
    paths = [_write(base, "hanging_cells", hanging)]
    huge = base / "submitted" / "notebook_50mb" / "00_setup" / "00_setup.ipynb"
    huge.parent.mkdir(parents=True)
    nb = attack(source, WRONG)
    nb.cells[0].source += "\n# " + "x" * (50 << 20)
    nbformat.write(nb, huge)
    paths.append(huge)
    result = G.grade(paths, source_dir=source_dir, timeout=CELL_TIMEOUT_S, jobs=2, budget_s=BUDGET_S,
                     roots=[base / "submitted"], progress=False)
    return _by_student(result)


def test_hanging_cells_stop_at_the_time_budget(limits):
    entry = limits["hanging_cells"]
    assert entry["score"] == 0 and entry["max_score"] == MAX
    assert any(f"time budget of {BUDGET_S} s" in e for e in entry["errors"]), entry["errors"]


def test_a_fifty_megabyte_notebook_is_refused_unread(limits):
    entry = limits["notebook_50mb"]
    assert entry["score"] == 0 and entry["max_score"] == MAX
    assert "over the 20 MB limit" in entry["errors"][0], entry["errors"]
    assert all(c["status"] == "not_run" for c in entry["cells"]), "refused before anything ran"


# ---------------------------------------------------------------------------------------------
# A forged record cannot make the grader run anything (no kernel needed)
# ---------------------------------------------------------------------------------------------


def test_a_forged_record_cannot_reach_the_graders_internals(tmp_path):
    """The record is written by the sandbox, so by the student: events that ask the grader's
    objects for `__class__` (-> `__subclasses__` -> `os.system`) must be refused, not re-done."""
    from autograder.membrane import Membrane
    from autograder.replay import replay
    from autograder.checks.nb00_setup import check_kv_bytes_per_token

    enc = Membrane("record").encode([[], {}], "S", full_tensors=True)
    # An honest record first: its last config is a SimpleNamespace, a grader object the student's
    # code holds as a handle (its attribute reads are callback events).
    record = tmp_path / "record.jsonl"
    from autograder import record as R
    R.start(str(record))
    try:
        check_kv_bytes_per_token(lambda c, b: 2 * c.num_layers * c.num_kv_heads * c.head_dim * b, seed=0)
    finally:
        R.SESSION = None
    entry = json.loads(record.read_text().splitlines()[0])
    events = entry["events"]
    ns_handle = next(e for e in events if e.get("k") == "O")["h"]
    last_sr = max(i for i, e in enumerate(events) if e.get("k") == "Sr")
    evil = [{"k": "O", "h": ns_handle, "op": "getattr", "n": "__class__", "a": enc},
            {"k": "Or", "v": {"G": 1}}]
    forged = events[:last_sr] + evil + events[last_sr:]
    ok, message = replay(check_kv_bytes_per_token, dict(entry, events=forged))
    assert not ok and "special attributes ('__class__')" in message, message
    # and the honest record still replays
    assert replay(check_kv_bytes_per_token, entry) == (True, "")
