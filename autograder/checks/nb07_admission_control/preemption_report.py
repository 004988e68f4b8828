"""Notebook 07, `preemption_report`: the counts read from an engine that preempted."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import broke, call, check, drive, expect, forbid_calls, kind_of, show
from course_lib import EngineConfig, LLMEngine, SamplingParams


def _served_engine(rng, num_pages, budget, prompt_lens, output_lens, max_steps=None, preemption="recompute"):
    engine = LLMEngine(fixtures.scripted_model_config(),
                       EngineConfig(page_size=4, num_pages=num_pages, max_num_seqs=6, max_num_batched_tokens=budget,
                                    admission="none", preemption=preemption))
    for i in range(6):
        out_len = rng.randint(*output_lens)
        engine.add_request([5] * rng.randint(*prompt_lens), SamplingParams(max_tokens=out_len), request_id=f"r{i}",
                           scripted_output_len=out_len)
    if max_steps is None:
        drive(engine, "preemption_report (preparing an engine run)", max_steps=3000)
    else:
        for _ in range(max_steps):
            engine.step()
    return engine


def _mid_run(seed):
    """A step count at which the run of `_served_engine(seed*1000+7, ...)` has preempted some request
    that is still unfinished (so a report that only counts finished requests is wrong)."""
    for steps in range(5, 400, 5):
        engine = _served_engine(random.Random(seed * 1000 + 7), 16, 8, (4, 20), (10, 30), max_steps=steps)
        if any(r.num_preemptions and not r.is_finished for r in engine.requests.values()) and \
                any(r.num_preemptions and r.is_finished for r in engine.requests.values()):
            return steps
    raise RuntimeError("internal: no mid-run state with preempted requests both finished and unfinished")


def _thrashing_engine(seed):
    """A run where requests are preempted several times each, and some step preempts two at once
    (so counting requests, events, steps and per-step maxima all give different numbers)."""
    for k in range(60):
        engine = _served_engine(random.Random(seed * 1000 + k), 16, 8, (4, 20), (10, 30))
        counts = [r.num_preemptions for r in engine.requests.values()]
        if (max(s.num_preemptions for s in engine.step_stats) >= 2 and max(counts) >= 3
                and 2 <= sum(1 for c in counts if c) < sum(counts)):
            return engine
    raise RuntimeError("internal: no thrashing run found")


def _report(engine):
    counts = [r.num_preemptions for r in engine.requests.values()]
    return {"preemptions": sum(counts), "preempted_requests": sum(1 for c in counts if c > 0),
            "max_preemptions_one_request": max(counts, default=0)}


def _preemption_report_module():
    from course_lib.sim import preemption

    return [preemption]


@check("preemption_report")
def check_preemption_report(impl, seed, allow_reference):
    name = "preemption_report"
    rng = random.Random(seed)
    runs = [("6 requests in a 16-page pool", _thrashing_engine(seed)),
            ("6 requests in a roomy pool", _served_engine(rng, 200, 64, (4, 8), (2, 10))),
            ("6 requests in a 16-page pool, stopped mid-run (some still running or waiting)",
             _served_engine(random.Random(seed * 1000 + 7), 16, 8, (4, 20), (10, 30), max_steps=_mid_run(seed))),
            ("6 requests in a 16-page pool with preemption off (each victim failed)",
             _served_engine(random.Random(seed * 1000 + 9), 16, 8, (4, 20), (10, 30), preemption="fail")),
            ("an engine that served nothing", LLMEngine(fixtures.scripted_model_config(), EngineConfig()))]
    for label, engine in runs:
        # From the engine before the student's code sees it (it is handed the engine itself).
        want = _report(engine)
        per_request = {r.request_id: r.num_preemptions for r in engine.requests.values() if r.num_preemptions}
        shown = f"{name}(engine) after {label}"
        with forbid_calls(name, _preemption_report_module(), enabled=not allow_reference):
            got = call(shown, impl, engine)  # a function that merely calls course_lib's report gets no credit
        expect(type(got) is dict, lambda: f"{shown} must return a dict, got {kind_of(got)}", rule="plain ints")
        for key in want:
            expect(key in got, lambda: f"{shown}: the result needs the key {key!r} (got keys "
                                       f"{sorted(show(k) for k in got)})", rule="plain ints")
            value = got[key]
            expect(type(value) is int, lambda: f"{shown}: result[{key!r}] must be an int, got {kind_of(value)} "
                                               f"{show(value)}", rule="plain ints")
        for key, w in want.items():
            g = got[key]
            if g == w:
                continue
            hint = ""
            if key == "preempted_requests" and g == want["preemptions"]:
                hint = " That is the number of preemption events; count the distinct requests that were preempted."
            elif g == 0 and w > 0:
                hint = (" Every request has finished by now, so the scheduler's queues are empty: read each "
                        "request's num_preemptions from engine.requests.")
            rule = {"preemptions": "every event", "preempted_requests": "distinct requests",
                    "max_preemptions_one_request": "the worst case"}[key]
            if "mid-run" in label or "served nothing" in label or (g == 0 and w > 0):
                rule = "any engine state"
            broke(rule, f"{shown}: {key} = {g}, expected {w} (per-request preemption counts: {per_request or 'none'}).{hint}")
