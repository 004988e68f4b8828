"""Checks for notebook 02 (continuous batching): the turnstile scheduler, and batch occupancy.

The student's scheduler class is plugged into the real engine (`LLMEngine(..., scheduler=...)`):
once serving a float64 model (greedy tokens must equal the dense model's), and several times with
the scripted runner (no compute) while every step is inspected: the token budget, the seats,
running requests first, the turnstile refilling seats at once, the admission policy obeyed,
finished requests retired with their pages freed, and no page leaked.
"""
from __future__ import annotations

import random

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.scheduler.output import StepStats

from .. import fixtures
from .._checking import call, check, drive, expect, fail, forbid_calls, same_float


def _reference_schedulers():
    from course_lib.scheduler.continuous import ContinuousScheduler
    from course_lib.scheduler.static import StaticScheduler

    return (ContinuousScheduler, StaticScheduler)


def _scheduler_base():
    from course_lib.scheduler.base import SchedulerBase

    return (SchedulerBase,)


def _reference_modules():
    import course_lib.scheduler.continuous as continuous
    import course_lib.scheduler.static as static

    return [continuous, static]


class _SpyAdmission:
    """Admits while fewer than `limit` unfinished requests run (None: always), and records each
    answer so the check can see whether a refusal was obeyed."""

    name = "spy"

    def __init__(self, limit=None):
        self.limit = limit
        self.calls = 0

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        self.calls += 1
        if self.limit is None:
            return True
        return sum(1 for r in running if r.finish_reason is None) < self.limit


class _Inspector:
    """Wraps the engine's scheduler.schedule to check every decision against the rules."""

    def __init__(self, engine, scenario: str, ample: bool, chunked: bool):
        self.engine, self.scenario, self.ample, self.chunked = engine, scenario, ample, chunked
        self.sched = engine.scheduler
        self.step = 0
        self._schedule = self.sched.schedule
        self.sched.schedule = self.schedule

    def schedule(self):
        sched, cfg = self.sched, self.engine.config
        before_running = [r for r in sched.running if r.finish_reason is None]
        num_waiting = len(sched.waiting)
        out = self._schedule()
        where = f"{self.scenario}, step {self.step}"
        self.step += 1
        expect(hasattr(out, "scheduled") and hasattr(out, "preempted"),
               f"{where}: schedule() must return a SchedulerOutput, got {type(out).__name__}")
        ids = [s.request_id for s in out.scheduled]
        expect(len(ids) == len(set(ids)), f"{where}: a request was scheduled twice in one step ({ids})")
        total = sum(s.num_new_tokens for s in out.scheduled)
        alone = not self.chunked and len(out.scheduled) == 1  # an unchunkable prompt may run alone
        expect(total <= cfg.max_num_batched_tokens or alone,
               f"{where}: {total} tokens scheduled but the step's budget is max_num_batched_tokens="
               f"{cfg.max_num_batched_tokens}: take min(pending tokens, budget left) for each request")
        live = [r for r in sched.running if r.finish_reason is None]
        expect(len(sched.running) <= cfg.max_num_seqs,
               f"{where}: {len(sched.running)} requests running but there are only max_num_seqs={cfg.max_num_seqs} seats")
        requests = self.engine.requests
        for s in out.scheduled:
            r = requests[s.request_id]
            expect(r in sched.running, f"{where}: {s.request_id} was scheduled but is not in self.running")
            expect(s.num_new_tokens >= 1, f"{where}: {s.request_id} scheduled with {s.num_new_tokens} tokens")
            expect(s.start == r.num_computed_tokens,
                   f"{where}: {s.request_id}'s entry has start={s.start} but it has computed {r.num_computed_tokens} tokens")
            expect(s.samples == (s.start + s.num_new_tokens == r.num_tokens),
                   f"{where}: {s.request_id}: samples must be True exactly when the chunk reaches the last known "
                   f"token (start {s.start} + {s.num_new_tokens} vs {r.num_tokens} tokens)")
            if not self.chunked:
                expect(s.num_new_tokens == r.num_tokens - r.num_computed_tokens,
                       f"{where}: enable_chunked_prefill is False but {s.request_id} got a chunk of {s.num_new_tokens} "
                       f"of its {r.num_tokens - r.num_computed_tokens} pending tokens: schedule a prompt whole or not at all")
        admitted = [r for r in live if r not in before_running]
        skipped = [r for r in before_running if r in sched.running and r.request_id not in ids]
        if admitted and skipped:
            fail(f"{where}: running request {skipped[0].request_id} got no tokens while newly admitted "
                 f"{admitted[0].request_id} did: running requests keep their seats and are served first; "
                 "admit from the queue only with the budget that is left")
        if self.ample and not out.preempted:
            expect(not skipped, f"{where}: running request {skipped[0].request_id if skipped else ''} got no tokens "
                                "although the budget and pages allowed it: every running request advances each step")
            want = min(cfg.max_num_seqs, len(before_running) + num_waiting)
            expect(len(live) == want,
                   f"{where}: {len(before_running)} requests were running and {num_waiting} waiting with "
                   f"{cfg.max_num_seqs} seats, so {want} should run after schedule(), but {len(live)} do: "
                   "admit waiting requests into every free seat in the same step (the turnstile), not only when "
                   "the batch is empty or one per step")
        return out

    def after_step(self, engine):
        sched, kv, pool = self.sched, engine.kv, engine.pool
        where = f"{self.scenario}, after step {self.step - 1}"
        for r in sched.running:
            if r.is_finished:
                fail(f"{where}: finished request {r.request_id} is still in self.running: finish(request) must "
                     "remove it (that frees its seat for the next waiting request)")
        for r in engine.requests.values():
            if r.is_finished and r.request_id in kv.tables:
                fail(f"{where}: request {r.request_id} finished but still holds {len(kv.tables[r.request_id].pages)} "
                     "KV pages: finish(request) must free them (self.kv.free(request))")
        held = sum(len(t.pages) for t in kv.tables.values())
        expect(held + pool.num_free_pages == pool.num_pages,
               f"{where}: requests hold {held} pages and {pool.num_free_pages} are free, but the pool has "
               f"{pool.num_pages}: pages leaked")


def _scripted_engine(impl, config: EngineConfig, admission, specs, scenario, ample, chunked=True):
    engine = LLMEngine(fixtures.scripted_model_config(), config, scheduler=impl, admission=admission)
    inspector = _Inspector(engine, scenario, ample, chunked)
    for i, (prompt_len, out_len) in enumerate(specs):
        engine.add_request([5] * prompt_len, SamplingParams(max_tokens=out_len), request_id=f"r{i}",
                           scripted_output_len=out_len)
    return engine, inspector


def _finish_checks(engine, scenario, specs):
    for i, (prompt_len, out_len) in enumerate(specs):
        r = engine.requests[f"r{i}"]
        expect(r.is_finished and r.num_output_tokens == out_len,
               f"{scenario}: request r{i} should have finished with {out_len} tokens, got {r.num_output_tokens} "
               f"({r.status.value})")
    sched = engine.scheduler
    expect(not sched.running and not sched.waiting,
           f"{scenario}: after every request finished, {len(sched.running)} remain in self.running and "
           f"{len(sched.waiting)} in self.waiting")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{scenario}: after every request finished only {engine.pool.num_free_pages} of "
           f"{engine.pool.num_pages} pages are free: finish(request) must free the request's pages")


def _run_scripted(impl, name, allow, config, admission, specs, scenario, ample, chunked=True):
    engine, inspector = _scripted_engine(impl, config, admission, specs, scenario, ample, chunked)
    with forbid_calls(name, _reference_modules(), enabled=not allow):
        drive(engine, f"{name} ({scenario})", max_steps=600, on_step=inspector.after_step)
    _finish_checks(engine, scenario, specs)
    return engine


@check("StudentScheduler", forbidden=_reference_schedulers, allowed_bases=_scheduler_base)
def check_StudentScheduler(impl, seed, allow_reference):
    name = "StudentScheduler"
    expect(isinstance(impl, type), f"{name} must be a class (a subclass of SchedulerBase), got {type(impl).__name__}")
    rng = random.Random(seed)

    # 1. The turnstile: few seats, ample pages and budget.
    specs = [(rng.randint(2, 10), rng.randint(1, 12)) for _ in range(8)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=3, max_num_batched_tokens=256, admission="none"),
                  _SpyAdmission(), specs, "3 seats, 8 requests", ample=True)

    # 2. A tight token budget: long prompts are chunked, running requests are served first.
    specs = [(rng.randint(12, 30), rng.randint(2, 8)) for _ in range(5)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=8, admission="none"),
                  _SpyAdmission(), specs, "budget of 8 tokens per step", ample=False)

    # 3. Chunked prefill switched off: a prompt is scheduled whole or not at all.
    specs = [(rng.randint(20, 30), rng.randint(2, 6)) for _ in range(4)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=64, admission="none",
                               enable_chunked_prefill=False),
                  _SpyAdmission(), specs, "enable_chunked_prefill=False", ample=False, chunked=False)

    # 4. The admission policy is obeyed.
    spy = _SpyAdmission(limit=2)
    specs = [(rng.randint(2, 8), rng.randint(2, 8)) for _ in range(6)]
    engine = _run_scripted(impl, name, allow_reference,
                           EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=256),
                           spy, specs, "an admission policy allowing 2 running requests", ample=False)
    expect(spy.calls > 0, f"{name}.schedule() never asked self.admission.can_admit(request, n, cached_pages, "
                          "self.kv, self.running) before admitting a request")
    expect(max(s.num_running for s in engine.step_stats) <= 2,
           f"{name} admitted a request although self.admission.can_admit(...) returned False (up to "
           f"{max(s.num_running for s in engine.step_stats)} requests ran; the policy allowed 2): stop admitting "
           "when it says no")

    # 5. A pool too small for everyone: make room by preempting, never run out of pages.
    specs = [(rng.randint(6, 10), rng.randint(10, 16)) for _ in range(5)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=12, max_num_seqs=4, max_num_batched_tokens=64, admission="none"),
                  _SpyAdmission(), specs, "a 12-page pool (preemption needed)", ample=False)

    # 6. Real tokens: the float64 model served through the scheduler equals the dense model.
    model = fixtures.random_model(seed)
    prompts = fixtures.random_prompts(rng, 5, model.config.vocab_size, lo=1, hi=14) + [
        fixtures.random_prompts(rng, 1, model.config.vocab_size, lo=17, hi=20)[0]]
    want = fixtures.greedy(model, prompts, 8)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=14, max_num_seqs=4, max_num_batched_tokens=16,
                                           admission="none"), scheduler=impl)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=8), request_id=f"r{i}")
    with forbid_calls(name, _reference_modules(), enabled=not allow_reference):
        drive(engine, f"{name} (float64 model, 14-page pool)", max_steps=400)
    for i, w in enumerate(want):
        got = engine.requests[f"r{i}"].output_token_ids
        expect(got == w, f"{name}: serving the float64 model, request r{i} (prompt of {len(prompts[i])} tokens) "
                         f"produced {got}, but the model's greedy answer is {w}: a chunk or a decode was scheduled "
                         "with the wrong start / number of tokens, or a request resumed from the wrong point")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{name}: after serving the model, {engine.pool.num_pages - engine.pool.num_free_pages} pages are still used")


# ---------------------------------------------------------------------------------------------
# mean_batch_occupancy
# ---------------------------------------------------------------------------------------------


def _stats(rows):
    """rows: (num_running, num_waiting, duration)."""
    out, t = [], 0.0
    for i, (running, waiting, duration) in enumerate(rows):
        out.append(StepStats(step=i, start_time=t, end_time=t + duration, num_running=running, num_waiting=waiting,
                             num_prefill_tokens=0, num_decode_tokens=running, num_padded_tokens=0,
                             context_tokens_read=0, attention_context_tokens=0, kv_tokens_written=running,
                             kv_used_slots=0, kv_allocated_slots=0, kv_total_slots=64, num_preemptions=0))
        t += duration
    return out


def _occupancy(rows, max_num_seqs):
    if not rows:
        return 0.0
    w = [d for _, _, d in rows]
    if sum(w) == 0:
        w = [1.0] * len(rows)
    return sum(wi * r for wi, (r, _, _) in zip(w, rows)) / (max_num_seqs * sum(w))


def _occupancy_hint(rows, seats, got) -> str:
    n = len(rows)
    alternatives = {
        "an unweighted mean over steps; weight each step by its duration (end_time - start_time)":
            sum(r for r, _, _ in rows) / (seats * n),
        "the mean number of running requests; divide by max_num_seqs to get a fraction of the seats":
            _occupancy(rows, 1),
        "waiting requests as if they held seats; only num_running counts":
            _occupancy([(r + w, 0, d) for r, w, d in rows], seats),
    }
    for reason, value in alternatives.items():
        if same_float(got, value) and not same_float(value, _occupancy(rows, seats)):
            return f" It looks like you computed {reason}."
    return ""


@check("mean_batch_occupancy")
def check_mean_batch_occupancy(impl, seed, allow_reference):
    rng = random.Random(seed)
    seats = rng.choice([4, 8])
    cases = [([(2, 0, 1.0), (4, 3, 1.0), (1, 0, 2.0)], 4)]
    cases.append(([(rng.randint(0, seats), rng.randint(0, 5), rng.choice([0.5, 1.0, 2.0, 3.5])) for _ in range(7)], seats))
    cases.append(([(rng.randint(0, seats), rng.randint(0, 3), 0.0) for _ in range(4)], seats))  # untimed steps
    cases.append(([], seats))
    for rows, max_num_seqs in cases:
        steps = _stats(rows)
        shown = (f"mean_batch_occupancy(<{len(rows)} steps: num_running {[r for r, _, _ in rows]}, durations "
                 f"{[d for _, _, d in rows]}>, max_num_seqs={max_num_seqs})")
        got = call(shown, impl, steps, max_num_seqs)
        want = _occupancy(rows, max_num_seqs)
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"{shown} must return a float, got {type(got).__name__} {got!r}")
        if not rows:
            expect(got == 0.0, f"{shown}: no steps means an occupancy of 0.0, got {got!r}")
            continue
        if all(d == 0 for _, _, d in rows) and not same_float(got, want):
            fail(f"{shown} = {got!r}, expected {want!r}: when no step has a duration, weigh the steps equally")
        expect(same_float(got, want), lambda: f"{shown} = {got!r}, expected {want!r} (time-weighted mean of "
                                              f"num_running / max_num_seqs).{_occupancy_hint(rows, max_num_seqs, got)}")
