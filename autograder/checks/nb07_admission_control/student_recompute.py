"""Notebook 07, `StudentRecompute`: the recompute hooks on a live engine, then a thrashing float64
workload served next to course_lib's scheduler."""
from __future__ import annotations

import contextlib
import random

from autograder import fixtures
from autograder._checking import (REFERENCE_MESSAGE, RunnerLedger, broke, call, check, drive, expect,
                                  expect_greedy_answers, fail)
from autograder.membrane import is_proxy
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.scheduler.request import RequestStatus

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
