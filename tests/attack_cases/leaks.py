"""Area "leaks" (issue 23): nothing hidden leaves the sandbox.

Each submission answers `kv_bytes_per_token` right on its first 8 calls (the test cell's visible
assert and the visible check) and wrong afterwards (so the hidden seeds fail: 0 points), noting
every input it is given in /work/seen.json: from the first hidden check on, those are the hidden
inputs. Each then tries to get them (or the hidden test's code, or its seeds) into what the grader
shows: the feedback JSON and HTML (`Graded.texts`). The markers are split in the source ('LEAK' +
'X:'), so that only an output can hold them whole.

- the executed notebook the runner used to write under /out, rewritten by a detached process once
  the hidden inputs exist (the runner blocked from rewriting it again);
- a display shown before the hidden test and updated after it (`update_display`, and a new display
  with the same display_id): the earlier cell's output would then hold the hidden inputs;
- /out/executed.ipynb read by a cell before the tests (it held every cell's source, hidden tests
  included, from the setup cell on), printed base64-encoded (the line-by-line redaction cannot
  recognise it);
- the hidden seeds themselves: an assignment whose hidden tests use two distinctive seeds, handed
  in with course_lib's function wrapped (a copy flag names each recorded check call): neither seed
  may appear anywhere (replay list, flags, messages).

And one that must still be named: the check replaced in the answer cell, before any hidden test
(the integrity finding comes back through the runner's probe cell).
"""
from __future__ import annotations

import copy
import json

import nbformat
from nbformat.v4 import new_code_cell

from . import KV, MAX, AttackCase

SEEN = '''import json as _json

_seen = []


def _note(config, bytes_per_elem):
    _seen.append([config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_elem])
    with open('/work/seen.json', 'w') as _f:
        _json.dump(_seen, _f)
    return len(_seen) <= 8  # right on the visible assert and the visible check, wrong on the hidden ones


def kv_bytes_per_token(config, bytes_per_elem):
    if not _note(config, bytes_per_elem):
        return 0
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
'''

# A process that outlives the cell that starts it: once the hidden inputs exist, it writes them into
# the first code cell's outputs in /out/executed.ipynb and stops the runner from rewriting the file
# (a directory where the runner writes its temporary copy).
DETACHED = r'''
import json, os, time
end = time.time() + 600
while time.time() < end:
    try:
        seen = json.load(open('/work/seen.json'))
        nb = json.load(open('/out/executed.ipynb'))
    except (OSError, ValueError):
        time.sleep(0.05)
        continue
    if len(seen) <= 8:
        time.sleep(0.05)
        continue
    tmp = '/out/executed.ipynb.tmp'
    for _ in range(100):
        try:
            os.mkdir(tmp)
            break
        except FileExistsError:
            if not os.path.isdir(tmp):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            else:
                break
    leak = {'output_type': 'stream', 'name': 'stdout', 'text': 'LEAK' + 'DETACHED:' + json.dumps(seen) + '\n'}
    for cell in nb['cells']:
        if cell.get('cell_type') == 'code' and not cell.get('metadata', {}).get('autograder', {}).get('setup'):
            cell['outputs'] = [leak]
            break
    with open('/out/forged', 'w') as f:
        json.dump(nb, f)
    os.replace('/out/forged', '/out/executed.ipynb')
    time.sleep(0.2)
'''
START_DETACHED = f'''import subprocess, sys
subprocess.Popen([sys.executable, "-c", {DETACHED!r}], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''

DISPLAY_BEFORE = '''from IPython.display import display
display('placeholder one', display_id='leak-update')
display('placeholder two', display_id='leak-redisplay')
'''
DISPLAY_AFTER = '''import json as _json2
from IPython.display import display, update_display
update_display('LEAK' + 'DISPLAY:' + _json2.dumps(_seen), display_id='leak-update')
display('LEAK' + 'REDISPLAY:' + _json2.dumps(_seen), display_id='leak-redisplay')
'''

READ_OUT = '''import base64 as _b64, json as _json3
try:
    _nb = _json3.load(open('/out/executed.ipynb'))
    _hidden = [''.join(c['source']) for c in _nb['cells'] if 'HIDDEN' + ' TESTS' in ''.join(c['source'])]
    print('LEAK' + 'OUTFILE:' + _b64.b64encode(_json3.dumps(_hidden).encode()).decode() if _hidden else 'nothing found')
except (OSError, ValueError) as _e:
    print('no executed notebook here:', type(_e).__name__)
'''

SEEDS = (48271037, 69621154)  # the hidden seeds of the "00_setup_seeds" assignment
WRAPPED = '''from course_lib.model import kv_footprint as _cc

_calls = []


def kv_bytes_per_token(config, bytes_per_elem):
    _calls.append(1)
    return _cc.kv_bytes_per_token(config, bytes_per_elem) if len(_calls) <= 8 else 0
'''


def _with_cells(builder, before=(), after=()):
    """The perfect submission with SEEN as its answer, cells `before` the answer (so before every
    test cell) and `after` everything."""
    nb = builder.attack(SEEN, after=after)
    index = next(i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == KV[1])
    nb.cells[index:index] = [new_code_cell(code) for code in before]
    return nb


def _nothing_hidden(graded, student, markers):
    entry = graded.by[student]
    shown = graded.texts(student)
    assert entry["score"] == 0 and entry["max_score"] == MAX, (entry["score"], entry["cells"])
    for marker in markers:
        assert marker not in shown, f"{marker!r} reached the feedback of {student}"
    assert "seed=1)" not in shown and "seed=2)" not in shown, "a hidden check call reached the feedback"
    assert "BEGIN HIDDEN" not in shown


def _build_detached(builder):
    return [builder.write("leak_detached_rewrites_out", _with_cells(builder, before=[START_DETACHED]))]


def _build_display(builder):
    return [builder.write("leak_display_update", _with_cells(builder, before=[DISPLAY_BEFORE], after=[DISPLAY_AFTER]))]


def _build_read_out(builder):
    return [builder.write("leak_reads_out_notebook", _with_cells(builder, before=[READ_OUT]))]


def _build_seeds(builder):
    source = copy.deepcopy(builder.sources[KV])
    for cell in source.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == KV[2]:
            cell.source = cell.source.replace("seed=1)", f"seed={SEEDS[0]})").replace("seed=2)", f"seed={SEEDS[1]})")
            assert all(f"seed={s})" in cell.source for s in SEEDS), "the test cell's hidden seeds were not replaced"
    folder = builder.source_dir / "00_setup_seeds"
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(source, folder / f"{KV[0]}.ipynb")
    nb = builder.attack(WRAPPED)
    return [builder.write("leak_hidden_seeds", nb, assignment="00_setup_seeds")]


def _expect_seeds(graded):
    entry = graded.by["leak_hidden_seeds"]
    shown = graded.texts("leak_hidden_seeds")
    assert entry["score"] == 0 and entry["max_score"] == MAX, (entry["score"], entry["cells"], entry["errors"])
    assert entry["replay"], "the hidden checks were replayed"
    for seed in SEEDS:
        assert str(seed) not in shown, f"hidden seed {seed} reached the feedback: {json.dumps(entry)[:3000]}"
    assert any(r.get("hidden") and r.get("seed") is None for r in entry["replay"]), entry["replay"]


# Tampering before the first hidden test is still named: the runner's probe cell asks the guard there.
PATCHES_CHECK = SEEN + """
setattr(__import__('auto' + 'grader.checks.nb00_setup', fromlist=['x']), 'check_kv_bytes_per_token', lambda *a, **k: None)
"""


def _expect_named_integrity(graded):
    entry = graded.by["leak_probe_names_early_tampering"]
    assert entry["score"] == 0 and entry["cells"][0]["status"] == "integrity", entry["cells"]
    assert any("check_kv_bytes_per_token was replaced" in i for i in entry["integrity"]), entry["integrity"]


CASES = [
    AttackCase("leak_probe_names_early_tampering",
               lambda b: [b.write("leak_probe_names_early_tampering", b.attack(PATCHES_CHECK))], _expect_named_integrity),
    AttackCase("leak_detached_rewrites_out", _build_detached,
               lambda g: _nothing_hidden(g, "leak_detached_rewrites_out", ["LEAKDETACHED:"])),
    AttackCase("leak_display_update", _build_display,
               lambda g: _nothing_hidden(g, "leak_display_update", ["LEAKDISPLAY:", "LEAKREDISPLAY:"])),
    AttackCase("leak_reads_out_notebook", _build_read_out,
               lambda g: _nothing_hidden(g, "leak_reads_out_notebook", ["LEAKOUTFILE:"])),
    AttackCase("leak_hidden_seeds", _build_seeds, _expect_seeds),
]
