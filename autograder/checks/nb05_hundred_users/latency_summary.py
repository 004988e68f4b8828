"""Notebook 05, `latency_summary`: the metrics' definitions on hand-built RequestOutputs, edge cases
first."""
from __future__ import annotations

import random

import numpy as np

from autograder._checking import (broke, call, check, expect, expect_unchanged, forbid_calls, kind_of, plain_float,
                                  pristine, same_float, show)
from course_lib.engine import RequestOutput


def _metrics_module():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.metrics as metrics

    return [metrics, closed_loop]


def _metrics_functions():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.metrics as metrics

    return (metrics.summarize, metrics.percentiles, closed_loop.latency_summary)


def _record(i, arrival, ttft, n_out, gap, reason="length", scheduled_delay=0.05):
    first = None if ttft is None else arrival + ttft
    finish = None if reason is None else (first if first is not None else arrival + 0.5) + gap * max(0, n_out - 1)
    return RequestOutput(request_id=f"r{i}", prompt_token_ids=[3] * 5, token_ids=[4] * n_out, finished=reason is not None,
                         finish_reason=reason, arrival_time=arrival, first_scheduled_time=arrival + scheduled_delay,
                         first_token_time=first, finish_time=finish)


def _summary_cases(rng: random.Random):
    cases = []
    # 1. A small hand-checkable run: 4 requests.
    cases.append([_record(0, 0.0, 0.5, 3, 0.1), _record(1, 0.2, 1.0, 5, 0.2), _record(2, 0.4, 0.3, 2, 0.4),
                  _record(3, 1.0, 2.0, 4, 0.05)])
    # 2. A random run with one-token answers, a failed and an aborted request (they finish last).
    run = []
    for i in range(rng.randint(9, 14)):
        run.append(_record(i, rng.uniform(0, 5), rng.uniform(0.05, 2.0), rng.choice([1, rng.randint(2, 30)]),
                           rng.uniform(0.01, 0.2), rng.choice(["length", "eos", "stop"])))
    run.append(_record(len(run), rng.uniform(0, 2), None, 0, 0.0, "error"))
    run[-1].finish_time = 9.0
    run.append(_record(len(run), rng.uniform(0, 2), rng.uniform(0.1, 1), 3, 0.1, "aborted"))
    run[-1].finish_time = 8.0
    rng.shuffle(run)
    cases.append(run)
    # 3. Only one-token answers: no TPOT at all.
    cases.append([_record(i, rng.uniform(0, 1), rng.uniform(0.1, 1), 1, 0.0) for i in range(3)])
    # 4. A single request.
    cases.append([_record(0, 0.5, 0.25, 6, 0.125)])
    # 5. An idle gap: a first burst, nothing in flight for a while, a second burst. The makespan (and so
    #    the throughput) runs from the first arrival to the last finish, idle time included.
    gap_start = rng.uniform(20.0, 40.0)
    burst = [_record(i, rng.uniform(0, 1), rng.uniform(0.1, 0.5), rng.randint(2, 8), 0.05) for i in range(3)]
    burst += [_record(3 + i, gap_start + rng.uniform(0, 1), rng.uniform(0.1, 0.5), rng.randint(2, 8), 0.05)
              for i in range(3)]
    rng.shuffle(burst)
    cases.append(burst)
    # 6. Zero-length steps: a request arriving at time 0 whose first token is at time 0 (TTFT 0.0, a real
    #    value, not a missing one), one whose tokens all came in one instant (TPOT 0.0), and a later one.
    zero = [_record(0, 0.0, 0.0, 1, 0.0, scheduled_delay=0.0), _record(1, 0.0, 0.0, 4, 0.0, scheduled_delay=0.0),
            _record(2, 0.5, 0.25, 3, 0.5)]
    cases.append(zero)
    # 7. A run that took no time at all: every time is 0.0; throughput 0.0, percentiles all 0.0.
    cases.append([_record(i, 0.0, 0.0, n, 0.0, scheduled_delay=0.0) for i, n in enumerate((1, 2, 3))])
    # 8. Nothing has finished yet (finish_time None): no completed request, no latency, no output token
    #    (so 0.0 tok/s, whatever the span), one request still waiting for its first token.
    cases.append([_record(0, 0.0, 0.4, 3, 0.1, reason=None), _record(1, rng.uniform(0.1, 1), None, 0, 0.0, reason=None)])
    # 9. Zero-length answers: completed requests that produced no token at all (no first token time). They
    #    count in `completed` and have a latency, but no TTFT and no TPOT.
    empty = [_record(i, rng.uniform(0, 1), rng.uniform(0.1, 0.5), rng.randint(2, 6), 0.05) for i in range(3)]
    for i in range(3, 3 + rng.randint(1, 2)):
        empty.append(_record(i, rng.uniform(0, 1), None, 0, 0.0, rng.choice(["stop", "length"])))
    rng.shuffle(empty)
    cases.append(empty)
    return cases


def _pct(values, method="linear"):
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99], method=method)
    return {"p50": float(p50), "p99": float(p99)}


def _summary(records, *, include_failed=False, tpot_div=lambda n: n - 1, ttft_from="arrival_time", method="linear",
             truthy=False, busy_time=False, drop_empty=False):
    done = [r for r in records if r.finish_time is not None and (include_failed or r.finish_reason not in ("error", "aborted"))]
    if drop_empty:  # the mistake: a request without a token taken for one that did not complete
        done = [r for r in done if r.token_ids]
    if truthy:  # the mistake: a time of 0.0 read as "missing"
        done = [r for r in done if r.first_token_time and r.arrival_time]
    ttft = [r.first_token_time - getattr(r, ttft_from) for r in done if r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / tpot_div(len(r.token_ids)) for r in done
            if r.first_token_time is not None and len(r.token_ids) >= 2]
    latency = [r.finish_time - r.arrival_time for r in done]
    finishes = [r.finish_time for r in records if r.finish_time is not None]
    span = max(finishes) - min(r.arrival_time for r in records) if finishes else 0.0
    if busy_time:  # the mistake: only the time something was in flight
        span = _busy_time(records)
    tokens = sum(len(r.token_ids) for r in done)
    return {"ttft": _pct(ttft, method), "tpot": _pct(tpot, method), "latency": _pct(latency, method),
            "throughput_tok_s": tokens / span if span > 0 else 0.0, "completed": len(done), "output_tokens": tokens}


def _busy_time(records):
    spans = sorted((r.arrival_time, r.finish_time) for r in records if r.finish_time is not None)
    total, end = 0.0, -float("inf")
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _show_records(records) -> str:
    """The records as (arrival, first token, finish, output tokens, reason) tuples, for messages."""
    def t(x):
        return "None" if x is None else f"{x:.4g}"

    rows = [f"({t(r.arrival_time)}, {t(r.first_token_time)}, {t(r.finish_time)}, {len(r.token_ids)}, {r.finish_reason})"
            for r in records[:8]]
    more = f", ... {len(records) - 8} more" if len(records) > 8 else ""
    return "[" + ", ".join(rows) + more + "] as (arrival, first_token, finish, n_out, reason)"


def _mismatch(got, want):
    """The first (key, got, want) that differs, or None."""
    for key in ("ttft", "tpot", "latency"):
        for p in ("p50", "p99"):
            g, w = got[key][p], want[key][p]
            if (g is None) != (w is None) or (w is not None and not same_float(g, w)):
                return f"{key}.{p}", g, w
    for key in ("completed", "output_tokens"):  # exact counters
        if not (type(got[key]) is int and got[key] == want[key]):
            return key, got[key], want[key]
    if not same_float(got["throughput_tok_s"], want["throughput_tok_s"]):
        return "throughput_tok_s", got["throughput_tok_s"], want["throughput_tok_s"]
    return None


# The rule each alternative reading breaks (the collapsed block of the notebook names them).
_HINT_RULES = {"failed / aborted": "completed only", "TPOT divided": "TPOT after the first",
               "TTFT measured from": "TTFT from arrival", "nearest-rank": "linear percentiles",
               "rounds down": "linear percentiles", "rounds up": "linear percentiles", "a time of 0.0": "zero is a time",
               "the throughput divided": "throughput over the makespan",
               "requests without an output token": "exact counters", "not sorted": "linear percentiles"}


_KEY_RULES = {"ttft": "TTFT from arrival", "latency": "TTFT from arrival", "tpot": "TPOT after the first",
              "completed": "exact counters", "output_tokens": "exact counters",
              "throughput_tok_s": "throughput over the makespan"}


def _rule_of(key: str, hint: str) -> str:
    for words, rule in _HINT_RULES.items():
        if words in hint:
            return rule
    return _KEY_RULES[key.split(".")[0]]


def _summary_hint(records, got, key) -> str:
    alternatives = {
        "failed / aborted requests were included; latency statistics count completed requests only":
            dict(include_failed=True),
        "TPOT divided by the number of output tokens; the first token is the TTFT, so there are n - 1 gaps":
            dict(tpot_div=lambda n: n),
        "TTFT measured from first_scheduled_time; it starts at arrival_time (queueing counts)":
            dict(ttft_from="first_scheduled_time"),
        "nearest-rank percentiles; use linear interpolation between order statistics (numpy.percentile's default)":
            dict(method="nearest"),
        "a percentile that rounds down to an order statistic; interpolate linearly (numpy.percentile's default)":
            dict(method="lower"),
        "a percentile that rounds up to an order statistic; interpolate linearly (numpy.percentile's default)":
            dict(method="higher"),
        "the throughput divided by the time something was in flight; it divides by the makespan, first arrival "
        "to last finish, idle gaps included (the machine was yours all along)": dict(busy_time=True),
        "requests without an output token were left out; a completed request with no token still counts in "
        "`completed` and has a latency (only its TTFT and TPOT are missing)": dict(drop_empty=True),
        "a time of 0.0 was taken for a missing one (a truthiness test): a request that arrives or gets its first "
        "token at time 0 is a real measurement; test `is None`": dict(truthy=True),
    }
    for reason, kwargs in alternatives.items():
        alt = _summary(records, **kwargs)
        if _mismatch(got, alt) is None:
            return f" It looks like {reason}."
    values = {"ttft": [r.first_token_time - r.arrival_time for r in records
                       if r.first_token_time is not None and r.finish_reason not in ("error", "aborted")]}
    if key.startswith("ttft") and len(values["ttft"]) > 2:
        v = values["ttft"]
        for q, p in ((0.5, "p50"), (0.99, "p99")):
            idx = min(len(v) - 1, int(q * len(v)))
            if p in key and same_float(got["ttft"][p], v[idx]) and v != sorted(v):
                return " It looks like the values were not sorted before taking the percentile."
    return ""


SHAPE = "the dict asked for"  # the rule of the result's keys and types


def _plain_summary(got, shown):
    """The student's summary as plain data (a dict of dicts of floats and ints), or a failure naming
    what is not: every value is read once and judged by its exact type."""
    expect(type(got) is dict, lambda: f"{shown} must return a dict, got {kind_of(got)}", rule=SHAPE)
    out = {}
    for key in ("ttft", "tpot", "latency"):
        part = got.get(key)
        expect(type(part) is dict and "p50" in part and "p99" in part,
               lambda: f"{shown}: result[{key!r}] must be a dict with keys 'p50' and 'p99', got {show(part)}",
               rule=SHAPE)
        out[key] = {}
        for p in ("p50", "p99"):
            value = part[p]
            expect(value is None or plain_float(value) is not None,
                   lambda: f"{shown}: result[{key!r}][{p!r}] must be a float (or None when there are no values), "
                           f"got {show(value)}", rule=SHAPE)
            out[key][p] = None if value is None else plain_float(value)
    for key in ("throughput_tok_s", "completed", "output_tokens"):
        expect(key in got, lambda: f"{shown}: the result needs a {key!r} key, got keys {sorted(show(k) for k in got)}",
               rule=SHAPE)
    throughput = got["throughput_tok_s"]
    expect(plain_float(throughput) is not None,
           lambda: f"{shown}: throughput_tok_s must be a float, got {show(throughput)}", rule=SHAPE)
    out["throughput_tok_s"] = plain_float(throughput)
    for key in ("completed", "output_tokens"):  # exact counters: ints, not 3.0 (judged in _mismatch)
        value = got[key]
        out[key] = value if type(value) in (int, float, bool, str, type(None)) else show(value)
    return out


@check("latency_summary", forbidden=_metrics_functions)
def check_latency_summary(impl, seed, allow_reference):
    with forbid_calls("latency_summary", _metrics_module(), enabled=not allow_reference):
        for records in _summary_cases(random.Random(seed)):
            # `records` stay the check's own: the student's code gets copies (the same values, other objects).
            shown = f"latency_summary({_show_records(records)})"
            want = _summary(records)
            given = pristine(records)
            got = call(shown, impl, list(given))
            for i, (handed, kept) in enumerate(zip(given, records)):
                expect_unchanged(shown, f"records[{i}]", handed, kept, rule="inputs unchanged")
            got = _plain_summary(got, shown)
            diff = _mismatch(got, want)
            if diff:
                key, g, w = diff
                extra = ""
                if w is None:
                    extra = " (no completed request has 2 or more output tokens: there is no TPOT, so report None)"
                hint = _summary_hint(records, got, key)
                broke("linear percentiles" if w is None else _rule_of(key, hint),
                      f"{shown}: {key} = {g!r}, expected {w!r}{extra}.{hint}")
