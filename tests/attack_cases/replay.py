"""Issue 23, area "replay": the record is data, never instructions.

The student's code can rewrite /out/record.jsonl, the record the grader replays. Each case's last
cell reads the record its test cell just wrote (the right answer's) and forges it:

- a callback that saves the grader's ModelConfig to a path of the student's choosing, relative to
  the grader's working directory and absolute (the red team wrote another student's result file
  and a check module this way): a zero naming the refusal, no file, the grader's cwd unchanged;
- the first answer nested 100,000 levels deep (the red team's RecursionError lost the notebook's
  whole result): a zero for that check with the reason, the notebook graded;
- every line stripped of the evidence the recorder always writes (code fingerprints, calls into
  the reference from other threads): flagged "the record was edited".

On the grader before this area's fix the first wrote both files (ModelConfig.save ran in the
grader's worker), the second crashed the grading of the notebook with RecursionError (read_records
caught ValueError only: "grader error"), the third passed unflagged.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import MAX, RIGHT, AttackCase

RELATIVE = "replay_planted_by_a_record.json"  # relative to the grader's working directory
_CWD = {}  # the grader's working directory when the batch was built

READ = '''import json

with open("/out/record.jsonl") as f:
    lines = [json.loads(line) for line in f]
'''
WRITE = '''
with open("/out/record.jsonl", "w") as f:
    f.writelines(json.dumps(entry) + "\\n" for entry in lines)
'''

# After the first callback of each check call (the answer reading config.num_layers), ask the
# grader's config (G-handle h) for its `save` method (it would be handle h + 1) and call it.
FORGE_SAVE = READ + '''
def plant(entry, path):
    events = entry["events"]
    first = next(i for i, e in enumerate(events) if e.get("k") == "O")
    after = next(j for j in range(first + 1, len(events)) if events[j].get("k") in ("Or", "Ox")) + 1
    config = events[first]["h"]
    no_args = {"L": [{"L": []}, {"D": []}]}
    save = [{"k": "O", "h": config, "op": "getattr", "n": "save", "a": no_args}, {"k": "Or", "v": {"G": config + 1}},
            {"k": "O", "h": config + 1, "op": "call", "n": None, "a": {"L": [{"L": [path]}, {"D": []}]}},
            {"k": "Or", "v": None}]
    entry["events"] = events[:after] + save + events[after:]

for entry, path in zip(lines, PATHS):
    plant(entry, path)
''' + WRITE

FORGE_DEEP = '''
with open("/out/record.jsonl") as f:
    lines = f.read().splitlines()
deep = 100_000
lines[0] = lines[0].replace('"k":"Sr","v":', '"k":"Sr","v":' + '{"L":[' * deep + "1" + "]}" * deep + ',"x":', 1)
with open("/out/record.jsonl", "w") as f:
    f.write("\\n".join(lines) + "\\n")
'''

FORGE_STRIPPED = READ + '''
for entry in lines:
    entry.pop("code", None)
    entry.pop("thread_reference_calls", None)
''' + WRITE


def _build_save(builder):
    absolute = builder.base / "replay_planted_absolute.json"
    paths = f"PATHS = [{RELATIVE!r}, {str(absolute)!r}]\n"
    _CWD["before"] = os.getcwd()
    return [builder.write("replay_config_save", builder.attack(RIGHT, after=[paths + FORGE_SAVE]))]


def _expect_save(graded):
    entry = graded.by["replay_config_save"]
    assert entry["score"] == 0 and entry["max_score"] == MAX, entry["cells"]
    assert not any("grader error" in e for e in entry["errors"]), entry["errors"]
    assert os.getcwd() == _CWD["before"], "the grader's working directory changed"
    shown = graded.texts("replay_config_save")
    assert "does not run ModelConfig.save" in shown, entry["replay"]
    for planted in (Path.cwd() / RELATIVE, Path.cwd().parent / RELATIVE, graded.base / "replay_planted_absolute.json"):
        assert not planted.exists(), f"a forged record made the grader write {planted}"


def _build_deep(builder):
    return [builder.write("replay_deep_nesting", builder.attack(RIGHT, after=[FORGE_DEEP]))]


def _expect_deep(graded):
    entry = graded.by["replay_deep_nesting"]
    assert entry["score"] == 0 and entry["max_score"] == MAX, entry["cells"]
    assert not any("grader error" in e for e in entry["errors"]), entry["errors"]
    assert "is nested deeper than 200 levels" in graded.texts("replay_deep_nesting"), entry["replay"]


def _build_stripped(builder):
    return [builder.write("replay_stripped_evidence", builder.attack(RIGHT, after=[FORGE_STRIPPED]))]


def _expect_stripped(graded):
    entry = graded.by["replay_stripped_evidence"]
    assert any("the record was edited (its line lacks the 'code', 'thread_reference_calls'" in f
               for f in entry["flags"]), entry["flags"]
    assert entry["score"] == MAX, ("the answer is right: the edit is flagged for review, not a zero", entry["cells"], entry["replay"], entry["errors"])


CASES = [
    AttackCase("replay_config_save", _build_save, _expect_save),
    AttackCase("replay_deep_nesting", _build_deep, _expect_deep),
    AttackCase("replay_stripped_evidence", _build_stripped, _expect_stripped),
]
