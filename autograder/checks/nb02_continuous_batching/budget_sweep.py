"""Notebook 02, `budget_sweep`: the token-budget sweep on the check's own workload under the
simulated clock, row by row against course_lib's measurement."""
from __future__ import annotations

import math
import random

from autograder._checking import (broke, call, check, expect, forbid_calls, kind_of, plain_float, plain_int, pristine,
                                  same_float, show)
from course_lib import LLMEngine, SamplingParams

_KEYS = ("budget", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")


def _sweep_workload(seed):
    """Short and long prompts arriving at about 40 per second, some one-token answers, then a
    silence of 3 s (the engine goes idle: the clock must jump) and two late requests."""
    from course_lib.sim.workload import RequestSpec

    rng = random.Random(1000 + seed)
    specs, t = [], 0.0
    for i in range(14):
        t += rng.expovariate(40.0)
        prompt = rng.randint(8, 64) if rng.random() < 0.6 else rng.randint(300, 900)
        output = 1 if i % 5 == 2 else rng.randint(4, 40)
        specs.append(RequestSpec(f"r{i}", prompt, output, t, None))
    t += 3.0
    specs.append(RequestSpec("r14", rng.randint(400, 800), rng.randint(5, 20), t, None))
    specs.append(RequestSpec("r15", rng.randint(8, 32), rng.randint(5, 20), t + 0.001, None))
    return specs


SPIN_CAP = 5000  # clock reads (now / wait_until) between two engine steps before a loop counts as endless


def _capped_clock(budget, shown):
    """The simulated H100 clock, counting the reads between two priced steps: a driver loop that spins
    without stepping (a request never submitted because `<` stands where `<=` belongs, so the idle clock
    jumps to its arrival again and again) fails within milliseconds, naming the cap, instead of hanging."""
    from course_lib.sim.clock import SimulatedClock

    class CappedClock(SimulatedClock):
        reads = 0

        def _count(self):
            self.reads += 1
            if self.reads > SPIN_CAP:
                broke("enter on arrival",
                      f"{shown}: at budget {budget}, the engine's clock was read {SPIN_CAP} times without an engine "
                      f"step in between (the check's cap; the clock stands at {1e3 * SimulatedClock.now(self):.1f} "
                      "ms): the loop spins without serving anything. A request whose arrival_time equals "
                      "clock.now() has arrived (<=, not <): submit it, then step")

        def now(self):
            self._count()
            return super().now()

        def wait_until(self, t):
            self._count()
            return super().wait_until(t)

        def charge(self, stats):
            self.reads = 0
            return super().charge(stats)

    return CappedClock("H100", "llama-3-8b")


def _sweep_engine(budget, seats, shown=""):
    """What course_lib.sim.token_budget.make_sweep_engine builds, built here: the student's run may not
    call into that module (it holds the answer)."""
    from course_lib.sim.simulate import make_engine_config, scripted_model_config

    config = make_engine_config(max_num_seqs=seats, max_num_batched_tokens=budget, kv_tokens=65536,
                                admission="none", max_model_len=2048)
    return LLMEngine(scripted_model_config(2048), config, clock=_capped_clock(budget, shown))


class _SweepHarness:
    """The make_engine / submit callables handed to the student's function: they build the check's
    engines and watch that every request enters a fresh engine once, and not before it arrives."""

    def __init__(self, seats, specs, shown=""):
        self.seats, self.specs, self.shown = seats, {s.request_id: s for s in pristine(specs)}, shown
        self.engines: list = []
        self.submitted: dict[int, set] = {}

    def make_engine(self, budget):
        value = plain_int(budget)
        expect(value is not None and value >= 1,
               lambda: f"make_engine(budget) was called with {show(budget)}: expected one of the budgets, an int >= 1",
               rule="fresh engine per budget")
        engine = _sweep_engine(value, self.seats, self.shown)
        self.engines.append(engine)
        self.submitted[id(engine)] = set()
        return engine

    def submit(self, engine, spec):
        seen = self.submitted.get(id(engine))
        expect(seen is not None, "submit(engine, spec) was called with an engine that make_engine(budget) did not build",
               rule="fresh engine per budget")
        rid = getattr(spec, "request_id", None)
        expect(type(rid) is str and rid in self.specs,
               lambda: f"submit(engine, spec) was called with {show(spec)}: expected one of the specs you were given",
               rule="enter on arrival")
        spec = self.specs[rid]  # the check's own copy: what the student's code was handed may have been changed
        expect(spec.request_id not in seen,
               f"submit: request {spec.request_id} was submitted twice to the same engine (each request enters once)",
               rule="enter on arrival")
        now = engine.clock.now()
        arrival = spec.arrival_time or 0.0
        expect(now >= arrival - 1e-12,
               f"submit: request {spec.request_id} arrives at {1e3 * arrival:.1f} ms but entered the engine at "
               f"{1e3 * now:.1f} ms: expected each request to enter once the clock (engine.clock.now()) has reached "
               "its arrival time, not before (an idle engine jumps there with engine.clock.wait_until)",
               rule="enter on arrival")
        seen.add(spec.request_id)
        engine.add_request([5] * spec.prompt_len, SamplingParams(max_tokens=spec.output_len),
                           request_id=spec.request_id, arrival_time=arrival, scripted_output_len=spec.output_len)


def _alternatives(budget, times):
    """Values a plausible misreading computes, to name it in the message."""
    import numpy as np

    ttft = [t[1] - t[0] for t in times.values() if len(t) > 1]
    gaps = [b - a for t in times.values() for a, b in zip(t[1:], t[2:])]
    with_first = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    tpot = [(t[-1] - t[1]) / (len(t) - 2) for t in times.values() if len(t) > 2]
    nearest = lambda v, q: 1e3 * sorted(v)[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]  # noqa: E731
    return {
        "itl_p99_ms": [(1e3 * np.percentile(with_first, 99), "the gap from arrival to the first token counted as an "
                        "inter-token gap (that is the TTFT; inter-token gaps start at the first token)"),
                       (1e3 * np.percentile(tpot, 99), "one mean gap per request (TPOT) instead of every gap between "
                        "consecutive tokens, all requests pooled"),
                       (nearest(gaps, 99), "a nearest-rank percentile; use np.percentile (linear interpolation)"),
                       (np.percentile(gaps, 99), "seconds; report milliseconds")],
        "itl_p50_ms": [(1e3 * np.percentile(with_first, 50), "the gap from arrival to the first token counted as an "
                        "inter-token gap"),
                       (1e3 * np.percentile(tpot, 50), "one mean gap per request (TPOT) instead of every gap"),
                       (np.percentile(gaps, 50), "seconds; report milliseconds")],
        "ttft_p50_ms": [(np.percentile(ttft, 50), "seconds; report milliseconds"),
                        (nearest(ttft, 50), "a nearest-rank percentile; use np.percentile (linear interpolation)")],
        "ttft_p99_ms": [(np.percentile(ttft, 99), "seconds; report milliseconds"),
                        (nearest(ttft, 99), "a nearest-rank percentile; use np.percentile (linear interpolation)")],
    }


def _rows_of(got, budgets, shown):
    expect(type(got) in (list, tuple), lambda: f"{shown} must return a list of dicts (one per budget), got "
                                               f"{kind_of(got)}", rule="one row per budget")
    got = list(got)
    expect(len(got) == len(budgets), f"{shown} returned {len(got)} rows, expected {len(budgets)} (one per budget)",
           rule="one row per budget")
    rows = []
    for i, row in enumerate(got):
        expect(type(row) is dict, lambda: f"{shown}: row {i} is {kind_of(row)}, expected a dict",
               rule="one row per budget")
        missing = [k for k in _KEYS if k not in row]
        expect(not missing, f"{shown}: row {i} lacks the keys {missing} (expected at least {list(_KEYS)})",
               rule="one row per budget")
        values = {}
        for k in _KEYS:
            v = row[k]
            value = plain_int(v) if k == "budget" else plain_float(v)
            expect(value is not None and math.isfinite(value),
                   lambda: f"{shown}: row {i}[{k!r}] = {show(v)}, expected a finite number"
                           + (" (an int: the budget you were given)" if k == "budget" else ""),
                   rule="one row per budget")
            values[k] = value
        rows.append(values)
    got = rows
    expect([row["budget"] for row in got] == list(budgets),
           f"{shown}: the rows' budgets are {[row['budget'] for row in got]}, expected {list(budgets)} (one row per "
           "budget, in the order given)", rule="one row per budget")
    return got


@check("budget_sweep")
def check_budget_sweep(impl, seed, allow_reference):
    import course_lib.sim.token_budget as token_budget
    from course_lib.sim.token_budget import budget_sweep, make_sweep_engine, submit, token_times

    rng = random.Random(seed)
    specs = _sweep_workload(seed)
    seats = rng.choice([3, 4, 6])
    budgets = [16, 64, 256, 1024]
    rng.shuffle(budgets)
    shown = (f"budget_sweep({budgets}, <{len(specs)} requests: prompts of {min(s.prompt_len for s in specs)}.."
             f"{max(s.prompt_len for s in specs)} tokens, an idle gap of 3 s>, make_engine (seats={seats}), submit)")
    # The expected rows first, from the check's own specs: the student's code is handed copies of them.
    want_rows = budget_sweep(list(budgets), pristine(specs), lambda b: make_sweep_engine(b, seats=seats), submit)
    harness = _SweepHarness(seats, specs, shown)
    with forbid_calls("budget_sweep", [token_budget], enabled=not allow_reference):
        got = call(shown, impl, list(budgets), pristine(specs), harness.make_engine, harness.submit)
    rows = _rows_of(got, budgets, shown)
    expect(len(harness.engines) == len(budgets),
           f"{shown}: make_engine was called {len(harness.engines)} times, expected {len(budgets)}: a fresh engine "
           "per budget (an engine keeps its clock and its requests)", rule="fresh engine per budget")
    for engine in harness.engines:
        missing = sorted(set(harness.specs) - harness.submitted[id(engine)])
        expect(not missing, f"{shown}: requests {missing[:4]} never entered the engine of budget "
                            f"{engine.config.max_num_batched_tokens}: expected every request served at every budget",
               rule="enter on arrival")

    for row, want in zip(rows, want_rows):
        for key in _KEYS[1:]:
            if same_float(row[key], want[key], rel=1e-6):
                continue
            times = token_times(make_sweep_engine(want["budget"], seats=seats), pristine(specs), submit)
            hint = ""
            for value, reason in _alternatives(want["budget"], times).get(key, []):
                if same_float(row[key], value, rel=1e-6):
                    hint = f" It looks like {reason}."
                    break
            broke("the measurements",
                 f"{shown}: at budget {want['budget']}, {key} = {float(row[key]):.4f}, expected {want[key]:.4f} "
                 f"(TTFT: arrival to first token per request; inter-token gaps: between consecutive tokens of one "
                 f"request, a token timed at the end of the step that produced it; p50 / p99 with np.percentile, in "
                 f"ms).{hint}")

    by_budget = sorted(rows, key=lambda r: r["budget"])
    small, big = by_budget[0], by_budget[-1]
    expect(small["ttft_p50_ms"] > big["ttft_p50_ms"] and small["itl_p99_ms"] < big["itl_p99_ms"],
           f"{shown}: expected the trade-off (budget {small['budget']}: higher TTFT p50, lower ITL p99 than budget "
           f"{big['budget']}), got TTFT p50 {small['ttft_p50_ms']:.1f} vs {big['ttft_p50_ms']:.1f} ms and ITL p99 "
           f"{small['itl_p99_ms']:.2f} vs {big['itl_p99_ms']:.2f} ms", rule="the measurements")

    # Again, on two of the budgets (each budget's row depends on its own fresh engine only, so these two rows
    # must come back as before; two, not all four: every engine call of the student's code crosses the
    # recording, and this half is a third of the check's time).
    twice = list(budgets[:2])
    harness2 = _SweepHarness(seats, specs, shown)
    with forbid_calls("budget_sweep", [token_budget], enabled=not allow_reference):
        again = call(shown, impl, twice, pristine(specs), harness2.make_engine, harness2.submit)
    again = _rows_of(again, twice, shown)
    for a, b in zip(rows, again):
        for key in _KEYS:
            expect(same_float(a[key], b[key], rel=1e-12),
                   f"{shown} run twice on the same workload gave {key} = {a[key]!r} then {b[key]!r} at budget "
                   f"{a['budget']}: expected the same numbers (measure with the engine's clock, engine.clock.now(), "
                   "not the wall clock)", rule="same rows twice")
