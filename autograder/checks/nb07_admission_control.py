"""Checks for notebook 07 (admission control): the watermark policy, the preemption report, the
break-it experiment the student designs, and preemption by recompute written by the student.

The policy is compared with its definition on a grid of pool states (free pages, the request's
own need, cached pages to revive, the exact boundary), then plugged into the real engine: under
load every one of its decisions is compared with the definition at the moment it is made, and a
float64 model served through it must keep its greedy tokens. The recompute hooks
(`SchedulerBase.choose_victim` / `preempt`, overridden on course_lib's ContinuousScheduler) are
called on a live engine, then serve a thrashing float64 workload next to course_lib's scheduler.
"""
from __future__ import annotations

import contextlib
import random

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool
from course_lib.kv.manager import KVCacheManager
from course_lib.scheduler.request import Request, RequestStatus

from .. import fixtures
from .._checking import (REFERENCE_MESSAGE, RunnerLedger, broke, call, check, drive, expect, expect_greedy_answers,
                         expect_unchanged, fail, forbid_calls, kind_of, plain_float, pristine, show)
from ..membrane import is_proxy


def _watermark_class():
    from course_lib.scheduler.admission import WatermarkAdmission

    return (WatermarkAdmission,)


def _admission_module():
    import course_lib.scheduler.admission as admission

    return [admission]


def _should_admit(watermark, request, n, cached, kv):
    need = kv.num_pages_needed(request, n, cached)
    return kv.num_free_pages - need >= watermark * kv.num_pages


def _describe(request, n, cached, kv, watermark):
    need = kv.num_pages_needed(request, n, cached)
    return (f"pool of {kv.num_pages} pages with {kv.num_free_pages} free, a new request whose first chunk of {n} "
            f"tokens needs {need} page(s) (page_size {kv.page_size}"
            + (f", starting from {len(cached)} cached page(s), {sum(1 for p in cached if kv.pool.ref_counts[p] == 0)} "
               "of them free and to be revived" if cached else "")
            + f"), watermark {watermark}: {kv.num_free_pages} - {need} = {kv.num_free_pages - need} free after "
              f"admitting vs {watermark} x {kv.num_pages} = {watermark * kv.num_pages:g} to keep")


def _grid(policy_cls, rng):
    """(watermark, request, n, cached, kv) states, boundary cases first."""
    states = []
    for used, watermark, n, cached_free, cached_used in [
        (10, 0.25, 20, 0, 0),   # 20 free, needs 5 -> 15 >= 5
        (11, 0.25, 16, 0, 0),   # 9 free, needs 4 -> exactly 5 left: admitted (>=)
        (12, 0.25, 16, 0, 0),   # 8 free, needs 4 -> 4 left: refused
        (14, 0.25, 4, 0, 0),    # 6 free, needs 1 -> exactly 5 left
        (6, 0.1, 9, 2, 1),      # cached pages: 2 free ones to revive, 1 in use
        (13, 0.25, 1, 2, 0),    # 7 free, 1 fresh + 2 revived -> 4 left: refused
        (10, 0.0, 37, 0, 0),    # watermark 0: anything that fits
        (0, 0.5, 1, 0, 0),
    ] + [(rng.randint(0, 16), rng.choice([0.05, 0.1, 0.2, 0.3]), rng.randint(1, 24), rng.randint(0, 2), rng.randint(0, 1))
         for _ in range(6)]:
        pool = BlockPool(20, 4)
        kv = KVCacheManager(pool, max_model_len=256)
        taken = pool.allocate(used) if used else []
        free_pages = [p for p in range(20) if pool.is_free(p)]
        cached = free_pages[-cached_free:] if cached_free else []
        cached += taken[:cached_used]
        prompt = [5] * (len(cached) * 4 + n)
        request = Request(f"req-{len(states)}", prompt, SamplingParams(max_tokens=8))
        states.append((watermark, request, n, cached, kv))
    return states


class _Judge:
    """Sits between the engine and the student's policy: compares every answer with the definition."""

    def __init__(self, policy, watermark):
        self.policy, self.watermark, self.calls = policy, watermark, 0

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        # The definition's answer first, from the engine's state as the policy is asked: the policy is
        # handed the engine's own kv manager, request and running list, and must leave them as they are.
        want = _should_admit(self.watermark, request, num_new_tokens, cached_pages, kv)
        described = _describe(request, num_new_tokens, cached_pages, kv, self.watermark)
        kept = pristine((request, kv, list(running)))
        got = call("can_admit(...)", self.policy.can_admit, request, num_new_tokens, cached_pages, kv, running)
        shown = f"StudentWatermark({self.watermark}).can_admit inside the engine"
        for what, handed, mine in zip(("request", "kv", "running"), (request, kv, list(running)), kept):
            expect_unchanged(shown, what, handed, mine)
        self.calls += 1
        expect(type(got) is bool or (type(got) is int and got in (0, 1)),
               lambda: f"{shown} must return a bool, got {kind_of(got)} {show(got)}", rule="count every page")
        if bool(got) != want:
            broke("count every page",
                  f"StudentWatermark({self.watermark}) inside the engine: can_admit returned {got!r} for "
                  f"{described}; expected {want}")
        return got


@check("StudentWatermark", forbidden=_watermark_class)
def check_StudentWatermark(impl, seed, allow_reference):
    name = "StudentWatermark"
    rng = random.Random(seed)
    with forbid_calls(name, _admission_module(), enabled=not allow_reference):
        for bad in (1.0, 1.5, -0.1, float("nan"), float("inf")):
            try:
                impl(bad)
            except ValueError:
                continue
            except NotImplementedError:
                raise  # unfinished: the notebook says so, not a broken rule
            except Exception as exc:  # noqa: BLE001
                broke("a valid fraction",
                      f"{name}({bad}) must raise ValueError (a watermark is a fraction in [0, 1)), got "
                     f"{type(exc).__name__}: {exc}")
            broke("a valid fraction",
                  f"{name}({bad}) must raise ValueError: a watermark is a fraction of the pool in [0, 1)")
        for watermark, request, n, cached, kv in _grid(impl, rng):
            policy = call(f"{name}({watermark})", impl, watermark)
            # The expected answer and the message from the check's own state, before the policy sees it;
            # the policy is handed copies, which it must leave as they are.
            want = _should_admit(watermark, request, n, cached, kv)
            need = kv.num_pages_needed(request, n, cached)
            described = _describe(request, n, cached, kv, watermark)
            given_request, given_kv = pristine((request, kv))
            before = (given_kv.num_free_pages, list(given_kv.pool.ref_counts))
            got = call("can_admit", policy.can_admit, given_request, n, list(cached), given_kv, [])
            expect(type(got) is bool or (type(got) is int and got in (0, 1)),
                   lambda: f"{name}.can_admit must return a bool, got {kind_of(got)} {show(got)}", rule="count every page")
            expect((given_kv.num_free_pages, list(given_kv.pool.ref_counts)) == before,
                   f"{name}.can_admit changed the pool: it must only decide, never allocate or free", rule="only decides")
            expect_unchanged(f"{name}.can_admit", "kv", given_kv, kv)
            expect_unchanged(f"{name}.can_admit", "request", given_request, request)
            if bool(got) != want:
                hint = ""
                if kv.num_free_pages - need == watermark * kv.num_pages:
                    hint = " (exactly at the watermark: that is still allowed, use >=)"
                elif want is False and got:
                    hint = (" (admitting it would leave less than the watermark free: count the pages the request "
                            "needs, kv.num_pages_needed(request, num_new_tokens, cached_pages), cached pages to "
                            "revive included)")
                broke("exactly is allowed" if kv.num_free_pages - need == watermark * kv.num_pages else "count every page",
                      f"{name}.can_admit returned {got!r} for {described}; expected {want}{hint}")
        # Under load, inside the engine.
        watermark = rng.choice([0.1, 0.2, 0.3])
        judge = _Judge(impl(watermark), watermark)
        engine = LLMEngine(fixtures.scripted_model_config(),
                           EngineConfig(page_size=4, num_pages=24, max_num_seqs=8, max_num_batched_tokens=64),
                           admission=judge)
        for i in range(10):
            out_len = rng.randint(4, 20)
            engine.add_request([5] * rng.randint(6, 20), SamplingParams(max_tokens=out_len), request_id=f"r{i}",
                               scripted_output_len=out_len)
        drive(engine, f"{name}({watermark}) (10 requests, a 24-page pool)", max_steps=500)
        expect(judge.calls > 0, f"{name}: the engine never asked the policy (internal error)")
    # Real tokens through the policy.
    model = fixtures.random_model(seed)
    prompts = fixtures.random_prompts(rng, 4, model.config.vocab_size, lo=2, hi=12)
    want = fixtures.greedy(model, prompts, 6)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=16, max_num_seqs=4), admission=impl(0.2))
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"{name}(0.2) (serving a float64 model)", max_steps=300)
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name}: serving a float64 model, request r{i} produced {got} instead of {w}"), rule="only decides")


# ---------------------------------------------------------------------------------------------
# preemption_report
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# break_it_config: the student designs the experiment
# ---------------------------------------------------------------------------------------------

# The experiment's fixed parts (the notebook states them): closed-loop users with the simulator's
# default chat-like lengths, pages of 16 tokens, the scripted runner on the simulated H100.
BREAK_IT_REQUESTS = 200
BREAK_IT_PAGE_SIZE = 16
BREAK_IT_LIMITS = {"users": (1, 256), "kv_tokens": (16, 131072), "max_tokens": (1, 1024)}
MID_GENERATION = "mid-generation"  # the engine's error for a request that could not grow


def run_break_it(config: dict, admission: str, preemption: str, seed: int):
    """One run of the experiment (the notebook calls this too): `config` as break_it_config returns it."""
    from course_lib.sim.simulate import make_engine_config, simulate
    from course_lib.sim.workload import ClosedLoopUsers

    engine_config = make_engine_config(kv_tokens=config["kv_tokens"], page_size=BREAK_IT_PAGE_SIZE,
                                       admission=admission, preemption=preemption,
                                       watermark=config.get("watermark", 0.05))
    return simulate(engine_config, ClosedLoopUsers(config["users"], BREAK_IT_REQUESTS, seed=seed),
                    max_tokens=config["max_tokens"], seed=seed, progress=False)


def failure_reasons(result) -> dict:
    """{'mid-generation': n, 'refused: ...': n}: why the failed requests of a run failed."""
    reasons: dict[str, int] = {}
    for r in result.requests:
        if r.finish_reason == "error":
            error = r.error or ""
            why = (MID_GENERATION if MID_GENERATION in error else
                   "refused: larger than the whole pool" if "whole pool" in error else f"other: {error[:60]}")
            reasons[why] = reasons.get(why, 0) + 1
    return reasons


def _validated_config(got):
    name = "break_it_config()"
    expect(type(got) is dict, lambda: f"{name} must return a dict with keys users, kv_tokens, max_tokens, watermark; "
                                      f"got {kind_of(got)}")
    for key in ("users", "kv_tokens", "max_tokens", "watermark"):
        expect(key in got, lambda: f"{name} needs the key {key!r} (got keys {sorted(show(k) for k in got)})",
               rule="values in range")
    for key, (lo, hi) in BREAK_IT_LIMITS.items():
        value = got[key]
        expect(type(value) is int and lo <= value <= hi,
               lambda: f"{name}[{key!r}] must be an int in [{lo}, {hi}], got {show(value)}", rule="values in range")
    expect(got["kv_tokens"] % BREAK_IT_PAGE_SIZE == 0,
           f"{name}['kv_tokens'] must be whole pages of {BREAK_IT_PAGE_SIZE} tokens, got {got['kv_tokens']}",
           rule="values in range")
    w = plain_float(got["watermark"])
    expect(w is not None and 0.0 <= w < 1.0,
           lambda: f"{name}['watermark'] must be a fraction of the pool in [0, 1), got {show(got['watermark'])}",
           rule="values in range")
    return {"users": got["users"], "kv_tokens": got["kv_tokens"], "max_tokens": got["max_tokens"], "watermark": w}


BREAK_IT_LONGEST_PROMPT = 1024  # the workload's prompt lengths are capped here (the notebook states it)


def largest_request_slots(max_tokens: int) -> int:
    """KV slots the largest request the workload can send needs: its prompt and every answer token but
    the last (whose K/V is never written), in whole pages."""
    slots = BREAK_IT_LONGEST_PROMPT + max_tokens - 1
    return -(-slots // BREAK_IT_PAGE_SIZE) * BREAK_IT_PAGE_SIZE


@check("break_it_config")
def check_break_it_config(impl, seed, allow_reference):
    got = call("break_it_config()", impl)
    config = _validated_config(got)
    shown = (f"users={config['users']}, kv_tokens={config['kv_tokens']}, max_tokens={config['max_tokens']}, "
             f"watermark={config['watermark']} (workload seed {seed}, {BREAK_IT_REQUESTS} requests)")
    largest = largest_request_slots(config["max_tokens"])
    expect(config["kv_tokens"] >= largest,
           f"break_it_config: {shown}: the pool must hold the largest request the workload can send, a "
           f"{BREAK_IT_LONGEST_PROMPT}-token prompt + max_tokens {config['max_tokens']} - 1 = "
           f"{BREAK_IT_LONGEST_PROMPT + config['max_tokens'] - 1} KV slots, {largest} in whole pages of "
           f"{BREAK_IT_PAGE_SIZE}; kv_tokens is {config['kv_tokens']}. A smaller pool may pass a seed that happens "
           "to draw no such prompt, but it refuses that request at the door on another: the failure it shows is a "
           "configuration error, not the one this experiment is about", rule="holds the largest request")
    broken = run_break_it(config, "none", "fail", seed)
    reasons = failure_reasons(broken)
    mid = reasons.get(MID_GENERATION, 0)
    if mid == 0:
        refused = sum(n for why, n in reasons.items() if why != MID_GENERATION)
        peak = max((s.kv_allocated_slots for s in broken.steps), default=0)
        if refused:
            broke("breaks without control",
                  f"break_it_config: with no admission control and preemption off, {shown}: no request failed "
                  f"mid-generation; {refused} were refused at the door because one request (a prompt of up to "
                  f"1,024 tokens + max_tokens) does not fit a pool of {config['kv_tokens']} tokens. That is not the "
                  "failure the experiment is about: make the pool hold any one request, and the load outgrow it")
        broke("breaks without control",
              f"break_it_config: with no admission control and preemption off, {shown}: every request completed "
              f"(the pool's peak use was {peak} of {config['kv_tokens']} slots). Choose a load and a max_tokens whose "
              "answers outgrow the pool once everyone is admitted")
    safe = run_break_it(config, "watermark", "recompute", seed)
    reasons = failure_reasons(safe)
    if reasons:
        broke("survives with the watermark",
              f"break_it_config: with watermark {config['watermark']} and preemption by recompute, {shown}: "
              f"{sum(reasons.values())} request(s) failed ({reasons}); expected none. Recompute cannot save a request "
              "that does not fit the pool at all: the pool must hold the largest request the workload can send")
    expect(safe.summary["requests_completed"] == BREAK_IT_REQUESTS,
           f"break_it_config: with watermark and preemption, {shown}: {safe.summary['requests_completed']} of "
           f"{BREAK_IT_REQUESTS} requests completed", rule="survives with the watermark")


# ---------------------------------------------------------------------------------------------
# StudentRecompute: preemption by recompute, written by the student
# ---------------------------------------------------------------------------------------------

RECOMPUTE = "StudentRecompute"


def _scheduler_classes():
    from course_lib.scheduler.base import SchedulerBase
    from course_lib.scheduler.continuous import ContinuousScheduler
    from course_lib.scheduler.victims import PreemptionScheduler

    return ContinuousScheduler, SchedulerBase, PreemptionScheduler


# course_lib classes whose choose_victim / preempt a student's class must not inherit (handing them in).
_COURSE_LIB_OWNERS = ("", "ContinuousScheduler", "SchedulerBase", "PreemptionScheduler", "YoungestFirst",
                      "OldestFirst", "MostPagesFirst")


@contextlib.contextmanager
def _reference_hooks_forbidden(enabled: bool):
    """While the block runs, course_lib's own choose_victim / preempt fail if called (a student's
    override that just delegates with super() is handing in the reference)."""
    if not enabled:
        yield
        return
    base = _scheduler_classes()[1]
    saved = {name: base.__dict__[name] for name in ("choose_victim", "preempt")}

    def forbidden(name):
        def stub(self, *args, **kwargs):
            fail(f"{RECOMPUTE} {REFERENCE_MESSAGE} (its {name} calls course_lib's SchedulerBase.{name})")
        return stub

    try:
        for name in saved:
            setattr(base, name, forbidden(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(base, name, fn)


def _who(requests):
    return [f"{r.request_id} (admitted #{r.admit_seq})" for r in requests]


def _state(engine):
    s = engine.scheduler
    return {"running": [r.request_id for r in s.running], "waiting": [r.request_id for r in s.waiting],
            "tables": {rid: list(t.pages) for rid, t in engine.kv.tables.items()},
            "free": engine.pool.num_free_pages, "refs": list(engine.pool.ref_counts)}


def _recompute_unit(impl, seed):
    """choose_victim and preempt called directly on a live engine: a question that changes nothing,
    and a give-back that leaves every piece of state where the rest of the engine expects it."""
    rng = random.Random(seed)
    model = fixtures.scripted_model_config()
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=64, max_num_seqs=3, max_num_batched_tokens=64,
                                           admission="none", enable_prefix_caching=True), scheduler=impl)
    ledger = RunnerLedger(engine)
    shared = [5 + rng.randrange(40) for _ in range(8)]
    engine.add_request(shared + [7, 8, 9], SamplingParams(max_tokens=30), request_id="a", scripted_output_len=30)
    engine.step()  # a's prompt: its two full pages are registered in the prefix cache
    for rid in ("b", "c", "d"):  # b and c join a; d waits (3 seats)
        engine.add_request(shared + [rng.randrange(3, 60) for _ in range(rng.randint(2, 6))],
                           SamplingParams(max_tokens=30), request_id=rid, scripted_output_len=30)
    for _ in range(3):
        engine.step()
    s = engine.scheduler
    expect([r.request_id for r in s.running] == ["a", "b", "c"] and [r.request_id for r in s.waiting] == ["d"],
           f"{RECOMPUTE} (internal): unexpected queues {_state(engine)}")
    before = _state(engine)
    # The candidates, before the student's code runs: outside a step every running request still
    # generating may be named (which one is the student's decision).
    candidates = [r for r in s.running if r.finish_reason is None]
    admitted = {rid: r.admit_seq for rid, r in engine.requests.items()}
    victim = call(f"{RECOMPUTE}.choose_victim()", s.choose_victim)
    expect(_state(engine) == before and {rid: r.admit_seq for rid, r in engine.requests.items()} == admitted,
           f"{RECOMPUTE}.choose_victim() changed the engine's state: it must only answer "
           "(the give-back is preempt's job, and the scheduler may ask without preempting)", rule="only answers")
    expect(any(victim is r for r in candidates),
           lambda: f"{RECOMPUTE}.choose_victim() with running {_who(s.running)} and waiting "
                   f"{[r.request_id for r in s.waiting]} returned {getattr(victim, 'request_id', victim)!r}: the victim "
                   "must be one of the running requests still generating (only they hold pages to give back)",
           rule="a running victim")
    # The give-back, on b: it shares a's two cached pages and owns the rest of its table.
    b = engine.requests["b"]
    pages = list(engine.kv.tables["b"].pages)
    shared_pages = [p for p in pages if p in engine.kv.tables["a"].pages]
    expect(len(shared_pages) >= 1, f"{RECOMPUTE} (internal): b shares no page with a: {before}")
    outputs, preemptions = list(b.output_token_ids), b.num_preemptions
    refs = list(engine.pool.ref_counts)
    queues = (s.running, s.waiting)
    call(f"{RECOMPUTE}.preempt(request 'b')", s.preempt, b)
    shown = (f"{RECOMPUTE}.preempt(b) (running a, b, c; waiting d; b holds pages {pages}, of which {shared_pages} "
             "are shared with a through the prefix cache)")
    # (Through the grading membrane a list crosses as a copy, so only the deque's identity can be seen
    # there; a rebound running list then shows in the engine run, see _thrash.)
    expect((is_proxy(s) or s.running is queues[0]) and s.waiting is queues[1],
           f"{shown}: change self.running and self.waiting in place (remove, appendleft, ...), do not assign new "
           "lists: the scheduler is walking them while it asks you to preempt", rule="in place")
    expect(b not in s.running and [r.request_id for r in s.running] == ["a", "c"],
           f"{shown}: b must leave the running list and the others stay in order; running is now "
           f"{[r.request_id for r in s.running]}", rule="out of the batch")
    expect(len(s.waiting) == 2 and s.waiting[0] is b and s.waiting[1].request_id == "d",
           f"{shown}: b must wait at the FRONT of the queue, ahead of d, which came later (first come, first "
           f"served: it is recomputed as soon as there is room); waiting is now {[r.request_id for r in s.waiting]}",
           rule="front of the queue")
    expect("b" not in engine.kv.tables,
           f"{shown}: b's pages must go back through the KV manager (kv.free(request)), which also forgets its page "
           "table; the manager still has a table for b", rule="pages through the manager")
    for p in pages:
        want = refs[p] - 1
        expect(engine.pool.ref_counts[p] == want,
               f"{shown}: page {p} had {refs[p]} owner(s) and must have {want} after b gave it back, got "
               f"{engine.pool.ref_counts[p]}" + (" (a still uses it: a shared page is not freed, one owner leaves)"
                                                  if p in shared_pages else ""), rule="pages through the manager")
    expect(engine.pool.num_free_pages == before["free"] + len(pages) - len(shared_pages),
           f"{shown}: {len(pages) - len(shared_pages)} page(s) must be free again: free pages went from "
           f"{before['free']} to {engine.pool.num_free_pages}", rule="pages through the manager")
    expect(b.num_computed_tokens == 0, f"{shown}: b's progress counter must restart at 0 (its K/V are gone, so all of "
                                       f"it is recomputed), got num_computed_tokens = {b.num_computed_tokens}",
           rule="progress restarts")
    expect(b.output_token_ids == outputs, f"{shown}: b must keep the {len(outputs)} tokens it already produced (they "
                                          "are recomputed as part of its context, not generated again); got "
                                          f"{len(b.output_token_ids)} tokens", rule="tokens kept")
    expect(b.status is RequestStatus.PREEMPTED, f"{shown}: b's status must say it waits to be recomputed "
                                                f"(RequestStatus.PREEMPTED), got {b.status}", rule="status preempted")
    expect(b.num_preemptions == preemptions, f"{shown}: preempt must not count the preemption: the scheduler counts it "
                                             f"(num_preemptions went from {preemptions} to {b.num_preemptions}, so "
                                             "every report would count it twice)", rule="not counted")
    expect(engine.requests["a"].num_computed_tokens > 0 and list(engine.kv.tables["a"].pages) == before["tables"]["a"],
           f"{shown}: a's pages and progress must not change", rule="pages through the manager")
    drive(engine, f"{RECOMPUTE} (after preempting b by hand, the engine finishing the run)", max_steps=400)
    expect(engine.requests["b"].num_output_tokens == 30, f"{RECOMPUTE}: after being preempted, b must still produce all "
                                                         f"30 tokens, got {engine.requests['b'].num_output_tokens}",
           rule="same answers")
    ledger.expect_requests_match(engine, f"{RECOMPUTE} (after preempting b by hand, the engine finishing the run)")


class _StepWatch:
    """After every engine step: who was preempted and who admitted (from the requests' own counters),
    checked against the rules: a victim was running, nothing is admitted in a step that preempted, and
    the pool's pages are all accounted for. Which running request is the victim is the student's choice."""

    def __init__(self, engine, label):
        self.engine, self.label = engine, label
        self.before = self._snapshot()
        self.events = 0

    def _snapshot(self):
        return {rid: (r.num_preemptions, r.admit_seq) for rid, r in self.engine.requests.items()}, \
            [(r.request_id, r.admit_seq) for r in self.engine.scheduler.running if r.finish_reason is None]

    def __call__(self, engine):
        counts, running = self.before
        now, _ = after = self._snapshot()
        step = len(engine.step_stats) - 1
        preempted = [rid for rid, (n, _) in now.items() if n > counts.get(rid, (0, -1))[0]]
        admitted = [rid for rid, (_, seq) in now.items() if seq != counts.get(rid, (0, -1))[1]]
        if preempted:
            self.events += sum(now[rid][0] - counts.get(rid, (0, -1))[0] for rid in preempted)
            was_running = {rid for rid, _ in running}
            stray = sorted(rid for rid in preempted if rid not in was_running and rid not in admitted)
            if stray:
                broke("a running victim", f"{RECOMPUTE} ({self.label}), step {step}: {stray} were preempted but were "
                      f"not running (running, oldest first: {[rid for rid, _ in sorted(running, key=lambda x: x[1])]})")
            if admitted:
                broke("front of the queue", f"{RECOMPUTE} ({self.label}), step {step}: {sorted(preempted)} were "
                      f"preempted and {sorted(admitted)} admitted in the same step: a step that had to preempt has a "
                      "full pool, and admitting then only preempts someone again (the scheduler admits nothing after "
                      "a preemption; does your preempt put the victim back where the scheduler expects it?)")
        pool = engine.pool
        held = sum(1 for rc in pool.ref_counts if rc > 0)
        if held + pool.num_free_pages != pool.num_pages:
            broke("pages through the manager", f"{RECOMPUTE} ({self.label}), step {step}: {held} pages held + "
                  f"{pool.num_free_pages} free != {pool.num_pages} in the pool: a page was lost or freed twice")
        self.before = after


# The step cap of an engine run through the student's scheduler: course_lib's youngest-first finishes these
# runs in well under 100 steps; a victim policy that starves a request (or livelocks) hits the cap instead.
THRASH_MAX_STEPS = 400


def _thrash(sched, seed, prefix_caching, label, allow, greedy=True, short_first=False):
    model = fixtures.random_model(seed)
    rng = random.Random(seed * 31 + prefix_caching)
    vocab = model.config.vocab_size
    head = fixtures.random_prompts(rng, 1, vocab, lo=8, hi=8)[0] if prefix_caching else []
    if short_first:  # the oldest has done the least work all along, and is scheduled first in every step
        prompts = fixtures.random_prompts(rng, 1, vocab, lo=2, hi=2) + fixtures.random_prompts(rng, 5, vocab, lo=13, hi=14)
    else:
        prompts = [head + p for p in fixtures.random_prompts(rng, 6, vocab, lo=3, hi=9)]
    want = fixtures.greedy(model, prompts, 12) if greedy else None  # before any scheduler of the student's runs
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=14, max_num_seqs=6, max_num_batched_tokens=32,
                                           admission="none", preemption="recompute",
                                           enable_prefix_caching=prefix_caching), scheduler=sched)
    ledger = RunnerLedger(engine)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=12), request_id=f"r{i}")
    watch = _StepWatch(engine, label)
    with _reference_hooks_forbidden(sched is not _scheduler_classes()[0] and not allow):
        try:
            drive(engine, f"{RECOMPUTE} ({label})", max_steps=THRASH_MAX_STEPS, on_step=watch)
        except AssertionError as exc:
            text = str(exc)
            if text.startswith('Rule "'):
                raise
            if "already runs this step" in text:
                broke("a running victim", f"{text} A victim must be a running request this step has not scheduled "
                      "yet: build on course_lib.scheduler.victims.PreemptionScheduler and choose from "
                      "self.preemptible (the youngest running request always qualifies). If you do: does your "
                      "preempt change self.running in place? A new list leaves the scheduler walking the old one, "
                      "the victim still in it")
            if "still unfinished after" in text:
                broke("everyone finishes", f"{text} (the cap: {THRASH_MAX_STEPS} steps; course_lib's youngest-first "
                      "needs far fewer). A victim policy must let every request finish: one that keeps preempting "
                      "the same requests, or a victim that never leaves the batch, starves them")
            if "left it in self.running" in text:
                broke("out of the batch", text)
            broke("same answers", text)
    return engine, want, watch, ledger


def _recompute_engine(impl, seed, allow):
    for prefix_caching, short_first in ((False, False), (True, False), (False, True)):
        label = ("6 requests of 12 tokens in a 14-page pool" +
                 (", prefix caching on (the prompts share 8 tokens)" if prefix_caching else "") +
                 (", the oldest with a 2-token prompt, the others 13-14 tokens" if short_first else ""))
        mine, want, watch, ledger = _thrash(impl, seed, prefix_caching, label, allow, short_first=short_first)
        expect_greedy_answers(mine, want, lambda i, got, w: (
            f"{RECOMPUTE} ({label}): request r{i} (preempted {mine.requests[f'r{i}'].num_preemptions} time(s)) "
            f"produced {got} instead of the model's greedy answer {w}: a recomputed request must restart from "
            "position 0 with its prompt and every token it had produced"), rule="same answers")
        counts = {rid: r.num_preemptions for rid, r in mine.requests.items()}
        expect(sum(counts.values()) > 0, f"{RECOMPUTE} ({label}): the run preempted nothing, yet 6 requests of up to "
                                         "20 tokens cannot all grow in 14 pages of 4: is your scheduler course_lib's "
                                         "ContinuousScheduler with choose_victim and preempt overridden?")
        expect(watch.events == mine.scheduler.num_preemptions == sum(counts.values()),
               f"{RECOMPUTE} ({label}): {watch.events} preemptions seen, scheduler counted "
               f"{mine.scheduler.num_preemptions}, requests {sum(counts.values())}: each must be counted once",
               rule="not counted")
        expect(mine.pool.num_free_pages == mine.pool.num_pages,
               f"{RECOMPUTE} ({label}): after every request finished, {mine.pool.num_pages - mine.pool.num_free_pages} "
               "pages are still held: a victim's pages leaked", rule="pages through the manager")
        # The requests' tokens and counters are within the scheduler's reach: hold them to the engine's own record.
        ledger.expect_requests_match(mine, f"{RECOMPUTE} ({label})", preemptions=True)


@check(RECOMPUTE, allowed_bases=_scheduler_classes)
def check_StudentRecompute(impl, seed, allow_reference):
    # Names, not issubclass / vars: through the grading membrane the class is a proxy, and these
    # attribute reads are what crosses it.
    bases = [k.__name__ for k in impl.__mro__] if isinstance(impl, type) else []
    expect("ContinuousScheduler" in bases,
           f"{RECOMPUTE} must be a class built on ContinuousScheduler (class {RECOMPUTE}(ContinuousScheduler)), got "
           f"{impl!r}")
    for name in ("choose_victim", "preempt"):
        owner = getattr(getattr(impl, name, None), "__qualname__", "").split(".")[0]
        expect(owner not in _COURSE_LIB_OWNERS,
               f"{RECOMPUTE} {REFERENCE_MESSAGE} (its {name} is still course_lib's {owner}.{name}: define your own "
               "in the class)")
    with _reference_hooks_forbidden(not allow_reference):
        _recompute_unit(impl, seed)
    _recompute_engine(impl, seed, allow_reference)
