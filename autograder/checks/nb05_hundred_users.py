"""Checks for notebook 05 (a hundred users): latency percentiles, and the closed-loop driver.

`latency_summary` is compared with the definitions of course_lib.sim.metrics (completed requests
only, TPOT over n - 1 gaps, numpy's linear-interpolation percentiles, throughput over the
makespan) on hand-built RequestOutputs: failed and aborted requests that finish last, one-token
answers, an idle gap with nothing in flight (it counts in the makespan), zero-length steps (a
TTFT of 0 at time 0, several tokens in one instant: a TPOT of 0), a run that takes no time at all
(throughput 0.0), and one where nothing has finished yet; the counters `completed` and `output_tokens` must be exact. `run_closed_loop` drives a scripted engine whose clock
advances by one per step, so "the next request is sent the moment the previous one finishes"
is an exact equation: after every step, sent = min(num_requests, num_users + finished). One case
serves fewer seats than users (`max_num_seqs < num_users`): requests queue on the server, in the
order they were sent (first come, first served), and the loop must still send each request the
moment its user is free, not when the server has room (that would hide the queueing from TTFT).
"""
from __future__ import annotations

import random

import numpy as np

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.engine import RequestOutput

from .. import fixtures
from .._checking import (broke, call, check, expect, expect_unchanged, fail, forbid_calls, kind_of, plain_float,
                         plain_int, pristine, same_float, show)


def _metrics_module():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.metrics as metrics

    return [metrics, closed_loop]


def _metrics_functions():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.metrics as metrics

    return (metrics.summarize, metrics.percentiles, closed_loop.latency_summary)


def _loop_modules():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.simulate as simulate

    return [closed_loop, simulate]


def _loop_functions():
    import course_lib.sim.closed_loop as closed_loop

    return (closed_loop.run_closed_loop,)


# ---------------------------------------------------------------------------------------------
# latency_summary
# ---------------------------------------------------------------------------------------------


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


def _plain_summary(got, shown):
    """The student's summary as plain data (a dict of dicts of floats and ints), or a failure naming
    what is not: every value is read once and judged by its exact type."""
    expect(type(got) is dict, lambda: f"{shown} must return a dict, got {kind_of(got)}")
    out = {}
    for key in ("ttft", "tpot", "latency"):
        part = got.get(key)
        expect(type(part) is dict and "p50" in part and "p99" in part,
               lambda: f"{shown}: result[{key!r}] must be a dict with keys 'p50' and 'p99', got {show(part)}")
        out[key] = {}
        for p in ("p50", "p99"):
            value = part[p]
            expect(value is None or plain_float(value) is not None,
                   lambda: f"{shown}: result[{key!r}][{p!r}] must be a float (or None when there are no values), "
                           f"got {kind_of(value)} {show(value)}")
            out[key][p] = None if value is None else plain_float(value)
    for key in ("throughput_tok_s", "completed", "output_tokens"):
        expect(key in got, lambda: f"{shown}: the result needs a {key!r} key, got keys {sorted(show(k) for k in got)}")
    throughput = got["throughput_tok_s"]
    expect(plain_float(throughput) is not None,
           lambda: f"{shown}: throughput_tok_s must be a float, got {kind_of(throughput)} {show(throughput)}")
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
                expect_unchanged(shown, f"records[{i}]", handed, kept)
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


# ---------------------------------------------------------------------------------------------
# run_closed_loop
# ---------------------------------------------------------------------------------------------


def _make_prompt(vocab):
    def make_prompt(rng):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 10))]
        return prompt, SamplingParams(max_tokens=rng.randint(1, 9))

    return make_prompt


IDLE_STEPS = 50  # engine.step() calls with nothing left to serve before the loop counts as endless


class _LoopWatch:
    """The engine handed to the student's loop, watched by the check: each request as it entered
    (through engine.add_request: its prompt, and how many engine steps had run by then) and each
    request's finished output as the engine's own step() returned it (the step that finished it, its
    tokens). The student's code can reach the engine's requests and rewrite their fields (arrival and
    finish times, status, tokens); it cannot reach this, so the verdict reads this.

    It also stops an endless loop at once (instead of at the grader's time limit): a loop that keeps
    stepping an engine with nothing left to serve would never end."""

    def __init__(self, engine, shown):
        self.steps = 0
        self.sent: list[tuple[str, list, int]] = []  # (request id, prompt, steps run before it entered)
        self.finished: dict[str, tuple[int, list]] = {}  # request id -> (its finishing step, its tokens)
        add_request, step, idle = engine.add_request, engine.step, [0]

        def add_and_note(*args, **kwargs):
            rid = add_request(*args, **kwargs)
            self.sent.append((rid, list(engine.requests[rid].prompt_token_ids), self.steps))
            return rid

        def step_and_note():
            idle[0] = 0 if engine.has_unfinished_requests else idle[0] + 1
            if idle[0] > IDLE_STEPS:
                broke("finished, in sent order",
                      f"{shown} called engine.step() {IDLE_STEPS} times in a row with no request left to serve "
                     f"({len(engine.requests)} sent, all finished): the loop never ends. Stop when all num_requests "
                     "requests have finished (the check's cap)")
            outputs = step()
            self.steps += 1
            for out in outputs:
                if out.finished and out.request_id not in self.finished:
                    self.finished[out.request_id] = (self.steps, list(out.token_ids))
            return outputs

        engine.add_request, engine.step = add_and_note, step_and_note


def _int_list(value):
    """`value` (a list or tuple of plain ints) as a list of ints, or None."""
    if type(value) not in (list, tuple):
        return None
    ints = [plain_int(x) for x in value]
    return None if any(x is None for x in ints) else ints


def _closed_loop_case(impl, num_users, num_requests, seed, allow_reference, max_num_seqs=None):
    mc = fixtures.scripted_model_config()
    engines, watches, prompts_made = [], [], []
    inner = _make_prompt(mc.vocab_size)

    def make_engine():
        engine = LLMEngine(mc, EngineConfig(page_size=4, num_pages=max(400, 6 * (num_users + 2)),
                                            max_num_seqs=max_num_seqs or num_users + 2, max_num_batched_tokens=512,
                                            admission="none"), clock=fixtures.StepClock())
        engines.append(engine)
        watches.append(_LoopWatch(engine, shown))
        return engine

    def make_prompt(rng):
        expect(isinstance(rng, random.Random), f"make_prompt must be called with rng = random.Random(seed), got "
                                               f"{type(rng).__name__}", rule="one engine, one rng")
        result = inner(rng)
        prompts_made.append(result)
        return result

    shown = f"run_closed_loop(make_engine, num_users={num_users}, num_requests={num_requests}, make_prompt, seed={seed})"
    if max_num_seqs:
        shown += f" on a server with only {max_num_seqs} seats (requests queue there)"
    with forbid_calls("run_closed_loop", _loop_modules(), enabled=not allow_reference):
        results = call(shown, impl, make_engine, num_users, num_requests, make_prompt, seed)
    expect(len(engines) == 1, f"{shown} called make_engine() {len(engines)} times: build one engine and serve every "
                              "request on it", rule="one engine, one rng")
    engine, watch = engines[0], watches[0]
    expect(len(prompts_made) == num_requests,
           f"{shown} called make_prompt {len(prompts_made)} times: it must send exactly num_requests={num_requests} requests",
           rule="one engine, one rng")
    rng = random.Random(seed)
    expected = [inner(rng) for _ in range(num_requests)]
    # What the check saw enter and finish, never the engine's requests (your code can rewrite those).
    seen = {rid for rid, _, _ in watch.sent}
    unseen = [rid for rid in engine.requests if rid not in seen]
    expect(not unseen, f"{shown}: requests {unseen[:5]} are in the engine but did not enter through the "
                       "engine.add_request the check handed you: send every request with engine.add_request",
           rule="one engine, one rng")
    sent = watch.sent
    expect(len(sent) == num_requests, f"{shown} added {len(sent)} requests to the engine, expected {num_requests}",
           rule="one engine, one rng")
    for k, ((rid, prompt_sent, _), (prompt, params)) in enumerate(zip(sent, expected)):
        if prompt_sent != prompt:
            same = all(p == sent[0][1] for _, p, _ in sent)
            broke("one engine, one rng", f"{shown}: request {k} has prompt {prompt_sent}, but the {k}-th make_prompt draw from "
                 f"random.Random({seed}) is {prompt}: "
                 + ("every request got the same prompt, so a new rng was created per request; "
                    if same else "")
                 + "create rng = random.Random(seed) ONCE and pass it to every make_prompt(rng) call, and send "
                   "each prompt with the SamplingParams make_prompt returned")
    unfinished = [rid for rid, _, _ in sent if rid not in watch.finished]
    elsewhere = [rid for rid in unfinished if engine.requests[rid].is_finished]
    expect(not elsewhere, f"{shown}: requests {elsewhere[:5]} look finished, but no engine.step() the check handed "
                          "you finished them: serve the requests by stepping the engine (engine.step()), and leave "
                          "their fields to the engine", rule="one engine, one rng")
    expect(not unfinished, f"{shown} returned while requests {unfinished[:5]} were unfinished: run until all "
                           f"{num_requests} are done", rule="finished, in sent order")
    # The closed loop, as an equation over the engine's steps (the step clock's times).
    arrivals = sorted(steps for _, _, steps in sent)
    finishes = sorted(watch.finished[rid][0] for rid, _, _ in sent)
    for t in range(int(max(finishes)) + 1):
        a = sum(1 for x in arrivals if x <= t)
        f = sum(1 for x in finishes if x <= t)
        want = min(num_requests, num_users + f)
        if a == want:
            continue
        if t == 0 and a > num_users:
            broke("send when answered", f"{shown}: {a} requests were sent at the start, but only num_users={num_users} users exist and "
                 "each waits for its answer before sending again (this is a closed loop, not all-at-once)")
        if a > want:
            broke("send when answered", f"{shown}: at step {t}, {a} requests had been sent but only {f} had finished: more than "
                 f"num_users={num_users} were outstanding")
        broke("the server queues" if max_num_seqs and max_num_seqs < num_users else "send when answered",
              f"{shown}: after step {t}, {f} requests had finished but only {a} had been sent (expected {want}): "
             "when a request finishes, its user sends the next one right away, before the engine's next step "
             "(for every request that finished in that step), whether or not the server has a free seat: "
             "the server queues it (first come, first served), and that wait is part of its TTFT")
    # The returned outputs: the finished outputs the engine's steps returned, in the order the requests were sent.
    expect(type(results) in (list, tuple) and len(results) == num_requests,
           lambda: f"{shown} must return a list of {num_requests} RequestOutputs, got {kind_of(results)}"
                   + (f" of length {len(results)}" if type(results) in (list, tuple) else ""),
           rule="finished, in sent order")
    for k, (out, (rid, _, _), (prompt, params)) in enumerate(zip(results, sent, expected)):
        expect(hasattr(out, "token_ids") and hasattr(out, "prompt_token_ids"),
               lambda: f"{shown}: item {k} must be a RequestOutput (what engine.step() returns), got {kind_of(out)}",
               rule="finished, in sent order")
        prompt_ids, tokens = _int_list(out.prompt_token_ids), _int_list(out.token_ids)
        if prompt_ids != prompt:
            broke("finished, in sent order", f"{shown}: item {k} of the result is not the {k}-th request sent (prompt {show(prompt_ids)} "
                 f"instead of {prompt}): return the outputs in the order the requests were sent")
        finished = out.finished
        want_tokens = watch.finished[rid][1]
        expect(finished is True and tokens is not None and len(tokens) == params.max_tokens,
               lambda: f"{shown}: item {k} should be the finished output with {params.max_tokens} tokens, got "
                       f"finished={show(finished)} with {len(tokens) if tokens is not None else show(out.token_ids)} "
                       "tokens: keep the output from the step where it finished", rule="finished, in sent order")
        expect(tokens == want_tokens,
               lambda: f"{shown}: item {k} holds the tokens {tokens}, but the engine's step that finished request "
                       f"{rid} returned {want_tokens}: return the RequestOutputs engine.step() gave you, as they were",
               rule="finished, in sent order")


@check("run_closed_loop", forbidden=_loop_functions)
def check_run_closed_loop(impl, seed, allow_reference):
    rng = random.Random(seed)
    num_users = rng.randint(3, 5)
    _closed_loop_case(impl, num_users, rng.randint(10, 16), seed, allow_reference)
    _closed_loop_case(impl, 4, 3, seed + 1, allow_reference)  # fewer requests than users
    _closed_loop_case(impl, 1, rng.randint(3, 5), seed + 3, allow_reference)  # one user: strictly one at a time
    _closed_loop_case(impl, rng.randint(4, 6), rng.randint(10, 14), seed + 2, allow_reference,
                      max_num_seqs=2)  # fewer seats than users: a queue on the server
    # More than 256 requests: counts compared with `is` / `is not` (identity, not value) break past
    # CPython's small-int cache.
    _closed_loop_case(impl, 260, 270, seed + 4, allow_reference)
