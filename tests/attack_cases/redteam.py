"""What the red team found after round two's fixes: text a student's code writes into the record
(which it may rewrite: /out is writable) reaching the feedback, and the record's counterpart
evidence erased. Each a submission of the batch."""
from __future__ import annotations

import re

from attack_cases import MAX, AttackCase

# The answer is right; on a hidden test's inputs it also appends record lines whose strings carry
# those inputs: a line for the visible check's (exercise, seed) with forged counterpart evidence, a
# line named after the inputs, and a cut line whose seed digits are the inputs.
_LEAK = r'''def kv_bytes_per_token(config, bytes_per_elem):
    key = (config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_elem)
    if key != (1, 1, 4, 4):
        import json
        tag = "L%d_H%d_D%d_B%d" % key
        line = {"exercise": "kv_bytes_per_token", "seed": SEED, "events": [], "impl": {}, "code": [],
                "outcome": {}, "thread_reference_calls": ["course_lib.model.contiguous_cache." + tag + " (another thread)",
                                                          "seen " + tag]}
        with open("/out/record.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
            f.write(json.dumps({"exercise": "seen_" + tag, "seed": 999, "events": []}) + "\n")
            f.write('{"exercise":"cut_%s","seed":%d%d%d%d,' % ((tag,) + key) + "\n")
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
'''
_HIDDEN_INPUTS = re.compile(r"L\d+_H\d+_D\d+_B\d+")

# Hands in course_lib's own function, then erases the recorder's evidence of the calls.
_ERASE = '''from course_lib.model.kv_footprint import kv_bytes_per_token as _kvb


def kv_bytes_per_token(config, bytes_per_elem):
    return _kvb(config, bytes_per_elem)
'''
_ERASE_CELL = '''import json as _j
_lines = [_j.loads(l) for l in open("/out/record.jsonl") if l.strip()]
for _l in _lines:
    _l["thread_reference_calls"] = []
    _l["code"] = []
with open("/out/record.jsonl", "w") as _f:
    _f.write("".join(_j.dumps(_l, separators=(",", ":")) + "\\n" for _l in _lines))
'''


def _no_hidden_inputs(student):
    def expect(graded):
        shown = graded.texts(student)
        assert not _HIDDEN_INPUTS.search(shown), _HIDDEN_INPUTS.search(shown).group(0)
        assert graded.by[student]["max_score"] == MAX
    return expect


def _unasked_lines_cost_nothing(graded):
    _no_hidden_inputs("rt_leak_unasked")(graded)
    entry = graded.by["rt_leak_unasked"]
    assert entry["score"] == MAX, entry["cells"]  # the right answer; its extra lines are ignored, by count
    assert any("name checks that no test cell calls" in e for e in entry["errors"]), entry["errors"]


def _erased_evidence_still_flagged(graded):
    entry = graded.by["rt_erase_evidence"]
    assert any("imports course_lib.model.kv_footprint.kv_bytes_per_token" in f for f in entry["flags"]), \
        entry["flags"]


CASES = [
    AttackCase("rt_leak_unasked", lambda b: [b.write("rt_leak_unasked", b.attack(_LEAK.replace("SEED", "999")))],
               _unasked_lines_cost_nothing),
    AttackCase("rt_leak_asked", lambda b: [b.write("rt_leak_asked", b.attack(_LEAK.replace("SEED", "0")))],
               _no_hidden_inputs("rt_leak_asked")),
    AttackCase("rt_erase_evidence", lambda b: [b.write("rt_erase_evidence", b.attack(_ERASE, [_ERASE_CELL]))],
               _erased_evidence_still_flagged),
]
