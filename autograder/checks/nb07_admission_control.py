"""Checks for notebook 07 (admission control): the watermark policy, and the preemption report.

The policy is compared with its definition on a grid of pool states (free pages, the request's
own need, cached pages to revive, the exact boundary), then plugged into the real engine: under
load every one of its decisions is compared with the definition at the moment it is made, and a
float64 model served through it must keep its greedy tokens.
"""
from __future__ import annotations

import random

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool
from course_lib.kv.manager import KVCacheManager
from course_lib.scheduler.request import Request

from .. import fixtures
from .._checking import call, check, drive, expect, fail, forbid_calls


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
        got = call("can_admit(...)", self.policy.can_admit, request, num_new_tokens, cached_pages, kv, running)
        want = _should_admit(self.watermark, request, num_new_tokens, cached_pages, kv)
        self.calls += 1
        if bool(got) != want:
            fail(f"StudentWatermark({self.watermark}) inside the engine: can_admit returned {got!r} for "
                 f"{_describe(request, num_new_tokens, cached_pages, kv, self.watermark)}; expected {want}")
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
            except Exception as exc:  # noqa: BLE001
                fail(f"{name}({bad}) must raise ValueError (a watermark is a fraction in [0, 1)), got "
                     f"{type(exc).__name__}: {exc}")
            fail(f"{name}({bad}) must raise ValueError: a watermark is a fraction of the pool in [0, 1)")
        for watermark, request, n, cached, kv in _grid(impl, rng):
            policy = call(f"{name}({watermark})", impl, watermark)
            before = (kv.num_free_pages, list(kv.pool.ref_counts))
            got = call("can_admit", policy.can_admit, request, n, list(cached), kv, [])
            expect(isinstance(got, bool) or got in (0, 1), f"{name}.can_admit must return a bool, got {got!r}")
            expect((kv.num_free_pages, list(kv.pool.ref_counts)) == before,
                   f"{name}.can_admit changed the pool: it must only decide, never allocate or free")
            want = _should_admit(watermark, request, n, cached, kv)
            if bool(got) != want:
                hint = ""
                need = kv.num_pages_needed(request, n, cached)
                if kv.num_free_pages - need == watermark * kv.num_pages:
                    hint = " (exactly at the watermark: that is still allowed, use >=)"
                elif want is False and got:
                    hint = (" (admitting it would leave less than the watermark free: count the pages the request "
                            "needs, kv.num_pages_needed(request, num_new_tokens, cached_pages), cached pages to "
                            "revive included)")
                fail(f"{name}.can_admit returned {got!r} for {_describe(request, n, cached, kv, watermark)}; "
                     f"expected {want}{hint}")
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
    for i, w in enumerate(want):
        got = engine.requests[f"r{i}"].output_token_ids
        expect(got == w, f"{name}: serving a float64 model, request r{i} produced {got} instead of {w}")


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
        want = _report(engine)
        shown = f"{name}(engine) after {label}"
        got = call(shown, impl, engine)
        expect(isinstance(got, dict), f"{shown} must return a dict, got {type(got).__name__}")
        for key in want:
            expect(key in got, f"{shown}: the result needs the key {key!r} (got keys {sorted(got)})")
            value = got[key]
            expect(isinstance(value, int) and not isinstance(value, bool),
                   f"{shown}: result[{key!r}] must be an int, got {type(value).__name__} {value!r}")
        for key, w in want.items():
            g = got[key]
            if g == w:
                continue
            hint = ""
            per_request = {r.request_id: r.num_preemptions for r in engine.requests.values() if r.num_preemptions}
            if key == "preempted_requests" and g == want["preemptions"]:
                hint = " That is the number of preemption events; count the distinct requests that were preempted."
            elif g == 0 and w > 0:
                hint = (" Every request has finished by now, so the scheduler's queues are empty: read each "
                        "request's num_preemptions from engine.requests.")
            fail(f"{shown}: {key} = {g}, expected {w} (per-request preemption counts: {per_request or 'none'}).{hint}")


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
    expect(isinstance(got, dict), f"{name} must return a dict with keys users, kv_tokens, max_tokens, watermark; "
                                  f"got {type(got).__name__}")
    for key in ("users", "kv_tokens", "max_tokens", "watermark"):
        expect(key in got, f"{name} needs the key {key!r} (got keys {sorted(got)})")
    for key, (lo, hi) in BREAK_IT_LIMITS.items():
        value = got[key]
        expect(isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi,
               f"{name}[{key!r}] must be an int in [{lo}, {hi}], got {value!r}")
    expect(got["kv_tokens"] % BREAK_IT_PAGE_SIZE == 0,
           f"{name}['kv_tokens'] must be whole pages of {BREAK_IT_PAGE_SIZE} tokens, got {got['kv_tokens']}")
    w = got["watermark"]
    expect(isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 <= w < 1.0,
           f"{name}['watermark'] must be a fraction of the pool in [0, 1), got {w!r}")
    return {k: got[k] for k in ("users", "kv_tokens", "max_tokens", "watermark")}


@check("break_it_config")
def check_break_it_config(impl, seed, allow_reference):
    got = call("break_it_config()", impl)
    config = _validated_config(got)
    shown = (f"users={config['users']}, kv_tokens={config['kv_tokens']}, max_tokens={config['max_tokens']}, "
             f"watermark={config['watermark']} (workload seed {seed}, {BREAK_IT_REQUESTS} requests)")
    broken = run_break_it(config, "none", "fail", seed)
    reasons = failure_reasons(broken)
    mid = reasons.get(MID_GENERATION, 0)
    if mid == 0:
        refused = sum(n for why, n in reasons.items() if why != MID_GENERATION)
        peak = max((s.kv_allocated_slots for s in broken.steps), default=0)
        if refused:
            fail(f"break_it_config: with no admission control and preemption off, {shown}: no request failed "
                 f"mid-generation; {refused} were refused at the door because one request (a prompt of up to "
                 f"1,024 tokens + max_tokens) does not fit a pool of {config['kv_tokens']} tokens. That is not the "
                 "failure the experiment is about: make the pool hold any one request, and the load outgrow it")
        fail(f"break_it_config: with no admission control and preemption off, {shown}: every request completed "
             f"(the pool's peak use was {peak} of {config['kv_tokens']} slots). Choose a load and a max_tokens whose "
             "answers outgrow the pool once everyone is admitted")
    safe = run_break_it(config, "watermark", "recompute", seed)
    reasons = failure_reasons(safe)
    if reasons:
        fail(f"break_it_config: with watermark {config['watermark']} and preemption by recompute, {shown}: "
             f"{sum(reasons.values())} request(s) failed ({reasons}); expected none. Recompute cannot save a request "
             "that does not fit the pool at all: the pool must hold the largest request the workload can send")
    expect(safe.summary["requests_completed"] == BREAK_IT_REQUESTS,
           f"break_it_config: with watermark and preemption, {shown}: {safe.summary['requests_completed']} of "
           f"{BREAK_IT_REQUESTS} requests completed")
