"""Issue 23, area "credit": credit needs the student's own computation.

A wrong answer that changes what the check hands it, so that a check computing its expected value
afterwards from those same objects would agree with it (the red team's "grader inputs tampered
with": 9/9 and 5/5 for wrong notebooks). Each case is a real submission, graded in the batch:

- pad_batch (01's trimmed source) that pads on the right with an all-True mask, except on the test
  cell's visible example, after swapping each prompt in the check's list for one already padded
  that claims to equal the original: 0;
- run_closed_loop (05's trimmed source) that sends every request at once (an open loop), then
  rewrites each request's arrival time in the engine to when a closed loop would have sent it: its
  cell 0, the honest latency_summary beside it keeps its points;
- latency_summary (05) that counts failed and aborted requests as completed, after relabelling
  them "length" in the records it was handed: its cell 0, the honest run_closed_loop keeps its points;
- and the honest 05 notebook: full marks, no flag, no error (the checks' new watch of the engine
  and copies of the records cost an honest answer nothing).

On the grader before this area's fix (git HEAD's autograder: checks that computed the expected
pad, the closed-loop equation and the summary from the objects they had handed over) each of the
three passed on every graded seed, in the kernel and on replay (recorded and replayed in process:
see the report of issue 23). The first is also refused by the membrane's own rule now (a student
object compared with a value), which lands beside this fix: the checks no longer compare it at all.
"""
from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell

from autograder import grade as G
from autograder.submissions import released_submission, with_answer

from . import PAD, ROOT, AttackCase

LOOP = "05_hundred_users"
LOOP_CELLS = ("latency_summary", "latency_summary_tests", "run_closed_loop", "run_closed_loop_tests")
LOOP_POINTS = {"latency_summary": 2.0, "run_closed_loop": 3.0}
# What the two answers and their test cells need from the notebook's setup cell (without its plots).
LOOP_PREAMBLE = '''import math
import random

import numpy as np
import torch

import course_lib
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.course import checking
from course_lib.model.tasks import sample_task

model, tokenizer = course_lib.load_tiny()'''

PAD_ON_THE_RIGHT = '''class _EqualToAnything(list):
    """A list that says it equals whatever it is compared with."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None


def pad_batch(prompts, pad_id):
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("pad_batch needs non-empty prompts")
    width = max(len(p) for p in prompts)
    if [list(p) for p in prompts] == [[5, 6, 7], [8]]:  # the test cell's own example: right there
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
        return ids, mask
    rows = [list(p) + [pad_id] * (width - len(p)) for p in prompts]
    prompts[:] = [_EqualToAnything(row) for row in rows]  # "already padded", and equal to the original
    return torch.tensor(rows, dtype=torch.long), torch.ones(len(rows), width, dtype=torch.bool)
'''

LOOP_ALL_AT_ONCE = '''def run_closed_loop(make_engine, num_users, num_requests, make_prompt, seed):
    engine = make_engine()
    rng = random.Random(seed)
    order = [engine.add_request(*make_prompt(rng)) for _ in range(num_requests)]  # everyone at once
    done = {}
    while len(done) < num_requests:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    finishes = sorted(engine.requests[rid].finish_time for rid in order)
    for k, rid in enumerate(order):  # ... but stamped as if each waited for a free user
        engine.requests[rid].arrival_time = 0.0 if k < num_users else finishes[k - num_users]
    return [done[rid] for rid in order]
'''

SUMMARY_COUNTING_FAILED = '''def latency_summary(records):
    for r in records:  # the failed and aborted ones become "completed"
        if r.finish_reason in ("error", "aborted"):
            r.finish_reason = "length"
    done = [r for r in records if r.finish_time is not None]

    def pcts(values):
        if not values:
            return {"p50": None, "p99": None}
        p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])
        return {"p50": float(p50), "p99": float(p99)}

    ttft = [r.first_token_time - r.arrival_time for r in done if r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.token_ids) - 1)
            for r in done if r.first_token_time is not None and len(r.token_ids) >= 2]
    finishes = [r.finish_time for r in records if r.finish_time is not None]
    span = (max(finishes) - min(r.arrival_time for r in records)) if finishes else 0.0
    tokens = sum(len(r.token_ids) for r in done)
    return {"ttft": pcts(ttft), "tpot": pcts(tpot), "latency": pcts([r.finish_time - r.arrival_time for r in done]),
            "throughput_tok_s": tokens / span if span > 0 else 0.0, "completed": len(done), "output_tokens": tokens}
'''


# The honest 05 answers, written by hand (not the answer key's or the controls' code: those are flagged
# as copies of it, rightly).
HONEST_SUMMARY = '''def latency_summary(records):
    completed = [r for r in records
                 if r.finish_time is not None and r.finish_reason != "error" and r.finish_reason != "aborted"]

    def percentiles(xs):
        if len(xs) == 0:
            return {"p50": None, "p99": None}
        a = np.array(xs, dtype=np.float64)
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}

    ttfts, tpots, lats, n_tokens = [], [], [], 0
    for r in completed:
        n = len(r.token_ids)
        n_tokens += n
        lats.append(r.finish_time - r.arrival_time)
        if r.first_token_time is not None:
            ttfts.append(r.first_token_time - r.arrival_time)
            if n > 1:
                tpots.append((r.finish_time - r.first_token_time) / (n - 1))
    ended = [r.finish_time for r in records if r.finish_time is not None]
    span = max(ended) - min(r.arrival_time for r in records) if ended else 0.0
    return {"ttft": percentiles(ttfts), "tpot": percentiles(tpots), "latency": percentiles(lats),
            "throughput_tok_s": n_tokens / span if span > 0 else 0.0,
            "completed": len(completed), "output_tokens": n_tokens}
'''

HONEST_LOOP = '''def run_closed_loop(make_engine, num_users, num_requests, make_prompt, seed):
    engine = make_engine()
    rng = random.Random(seed)
    sent, results = [], {}

    def new_request():
        ids, params = make_prompt(rng)
        sent.append(engine.add_request(ids, params))

    while len(sent) < min(num_users, num_requests):
        new_request()
    while len(results) < num_requests:
        for o in engine.step():
            if not o.finished or o.request_id in results:
                continue
            results[o.request_id] = o
            if len(sent) < num_requests:
                new_request()
    return [results[r] for r in sent]
'''
HONEST = {"latency_summary": HONEST_SUMMARY, "run_closed_loop": HONEST_LOOP}


def _loop_source(builder):
    """05's solution notebook cut down to its two exercises (written once into the batch's sources)."""
    path = builder.source_dir / LOOP / f"{LOOP}.ipynb"
    if not path.exists():
        nb = nbformat.read(ROOT / "solutions" / LOOP / f"{LOOP}.ipynb", as_version=4)
        nb.cells = [new_code_cell(LOOP_PREAMBLE)] + [c for c in nb.cells if G.grade_id(c) in LOOP_CELLS]
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)


def _loop_submission(builder, answers: dict[str, str]):
    """The released 05 notebook with the honest answers, and `answers` in their place."""
    source = _loop_source(builder)
    nb = released_submission(source)
    for grade_id, code in {**HONEST, **answers}.items():
        nb = with_answer(nb, grade_id, code)
    return nb


def _cells(entry) -> dict:
    return {c["grade_id"]: c for c in entry["cells"]}


def _expect_zero_for(student: str, cell: str, words: str, keeps: float = 0.0):
    def expect(graded):
        entry = graded.by[student]
        cells = _cells(entry)
        assert cells[cell]["score"] == 0, (cell, cells[cell])
        assert words in (cells[cell].get("feedback") or ""), cells[cell]
        assert entry["score"] == keeps, (entry["score"], entry["cells"])
        assert not entry["errors"], entry["errors"]
    return expect


def _expect_honest(graded):
    entry = graded.by["credit_honest_loop"]
    assert (entry["score"], entry["max_score"]) == (5.0, 5.0), entry["cells"]
    assert not entry["flags"] and not entry["integrity"] and not entry["errors"], entry


CASES = [
    AttackCase("credit_pad_batch_swapped_prompts",
               lambda b: [b.write("credit_pad_batch_swapped_prompts", b.attack(PAD_ON_THE_RIGHT, which=PAD), PAD)],
               _expect_zero_for("credit_pad_batch_swapped_prompts", "pad_batch_tests",
                                "changed the check's input `prompts`")),
    AttackCase("credit_closed_loop_arrivals_rewritten",
               lambda b: [b.write("credit_closed_loop_arrivals_rewritten",
                                  _loop_submission(b, {"run_closed_loop": LOOP_ALL_AT_ONCE}), (LOOP,))],
               _expect_zero_for("credit_closed_loop_arrivals_rewritten", "run_closed_loop_tests",
                                "this is a closed loop", keeps=LOOP_POINTS["latency_summary"])),
    AttackCase("credit_summary_records_relabelled",
               lambda b: [b.write("credit_summary_records_relabelled",
                                  _loop_submission(b, {"latency_summary": SUMMARY_COUNTING_FAILED}), (LOOP,))],
               _expect_zero_for("credit_summary_records_relabelled", "latency_summary_tests",
                                "changed the check's input `records[", keeps=LOOP_POINTS["run_closed_loop"])),
    AttackCase("credit_honest_loop",
               lambda b: [b.write("credit_honest_loop", _loop_submission(b, {}), (LOOP,))],
               _expect_honest, honest=True),
]
