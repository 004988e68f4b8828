"""Notebook 02, `StudentScheduler`: the turnstile scheduler in the real engine, every step inspected
against the rules the notebook states, and a float64 model's greedy tokens kept."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import RunnerLedger, broke, check, drive, expect, expect_greedy_answers, forbid_calls
from course_lib import EngineConfig, LLMEngine, SamplingParams


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
    """Admits while fewer than `limit` unfinished requests run (None: always), and counts the calls
    so the check can see whether the policy was asked at all."""

    name = "spy"

    def __init__(self, limit=None):
        self.limit = limit
        self.calls = 0

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        self.calls += 1
        return self.allows(request, running)

    def allows(self, request, running) -> bool:
        """The verdict without counting a call (the inspector asks it too)."""
        return self.limit is None or sum(1 for r in running if r.finish_reason is None) < self.limit


class _PickyAdmission:
    """Refuses prompts longer than `longest` tokens while anyone runs (an empty engine admits
    anything): the head of the queue gets refused while shorter requests behind it would fit."""

    name = "picky"

    def __init__(self, longest: int):
        self.longest = longest
        self.refused: list[str] = []

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        if not self.allows(request, running):
            self.refused.append(request.request_id)
            return False
        return True

    def allows(self, request, running) -> bool:
        """The verdict without recording a refusal (the inspector asks it too)."""
        busy = any(r.finish_reason is None for r in running)
        return not (busy and request.num_prompt_tokens > self.longest)


def _ids(requests) -> list[str]:
    return [r.request_id for r in requests]


class _Inspector:
    """Wraps the engine's scheduler.schedule to check every decision against the rules."""

    def __init__(self, engine, scenario: str, ample: bool, chunked: bool, admission):
        self.engine, self.scenario, self.ample, self.chunked = engine, scenario, ample, chunked
        self.admission = admission
        self.sched = engine.scheduler
        self.step = 0
        self.preempting_steps = 0
        self._schedule = self.sched.schedule
        self.sched.schedule = self.schedule

    def schedule(self):
        # Each read of the scheduler's attributes is a question to the student's object (through the grading
        # recording, one crossing each): what stays the same within a step is read once before schedule()
        # and once after it.
        sched, cfg = self.sched, self.engine.config
        kv = sched.kv
        before_running = [r for r in sched.running if r.finish_reason is None]
        waiting_before = list(sched.waiting)
        # What each waiting request could start from (course_lib's lookup takes no page reference and moves
        # no counter, so asking changes nothing): an admitted request must start right after its cached pages.
        page_size = kv.page_size
        cached_before = {r.request_id: len(kv.lookup_prefix(r)) * page_size for r in waiting_before}
        out = self._schedule()
        running = list(sched.running)
        where = f"{self.scenario}, step {self.step}"
        self.step += 1
        expect(hasattr(out, "scheduled") and hasattr(out, "preempted"),
               f"{where}: schedule() must return a SchedulerOutput, got {type(out).__name__}")
        ids = [s.request_id for s in out.scheduled]
        expect(len(ids) == len(set(ids)), f"{where}: a request was scheduled twice in one step ({ids})")
        live = [r for r in running if r.finish_reason is None]
        # Admitted this step: newly seated, or preempted and seated again (the victim re-admitted).
        admitted = [r for r in live if not any(r is b for b in before_running) or r.request_id in out.preempted]
        if out.preempted:
            self.preempting_steps += 1
            expect(not admitted,
                   f"{where}: this step preempted {out.preempted} (the pool is full) and still admitted "
                   f"{_ids(admitted)} from the queue: expected no admission in a step that preempted, got "
                   f"{len(admitted)}", rule="no admission after preempting")
        head = waiting_before[:len(admitted)]
        if not out.preempted and _ids(admitted) != _ids(head):
            broke("first come, first served",
                  f"{where}: the queue was {_ids(waiting_before)[:6]} and this step admitted {_ids(admitted)}: "
                  f"first come, first served means the first {len(admitted)} of the queue, in order "
                  f"(expected {_ids(head)}); when the head cannot start (no seat, no budget, not enough free pages, "
                  "or the policy says no), nobody behind it starts either")
        total = sum(s.num_new_tokens for s in out.scheduled)
        alone = not self.chunked and len(out.scheduled) == 1  # an unchunkable prompt may run alone
        expect(total <= cfg.max_num_batched_tokens or alone,
               f"{where}: {total} tokens scheduled ({[(s.request_id, s.num_new_tokens) for s in out.scheduled]}) "
               f"but the step's budget is max_num_batched_tokens={cfg.max_num_batched_tokens}", rule="token budget")
        expect(len(running) <= cfg.max_num_seqs,
               f"{where}: {len(running)} requests running but there are only max_num_seqs={cfg.max_num_seqs} seats",
               rule="seats")
        requests = self.engine.requests
        short = []
        for s in out.scheduled:
            r = requests[s.request_id]
            if not any(r is x for x in running):
                refused = r.request_id in out.preempted
                broke("never out of pages" if refused else "running first",
                      f"{where}: {s.request_id} was scheduled but is not in self.running"
                      + (": it was preempted in this very step (self._make_room returned False: it was the youngest "
                         "and gave its own pages back), so it gets nothing now; expected the step's service of "
                         "running requests to stop there" if refused else ""))
            expect(s.num_new_tokens >= 1, f"{where}: {s.request_id} scheduled with {s.num_new_tokens} tokens")
            expect(s.start == r.num_computed_tokens,
                   f"{where}: {s.request_id}'s entry has start={s.start} but it has computed {r.num_computed_tokens} "
                   "tokens (after a prefix-cache hit the counter has moved: build the entry after admitting)",
                   rule="prefix hits skipped")
            expect(s.start + s.num_new_tokens <= r.num_tokens,
                   f"{where}: {s.request_id} has {r.num_tokens} known tokens, {s.start} computed, but was scheduled "
                   f"{s.num_new_tokens} more (expected at most {r.num_tokens - s.start}): tokens served from the "
                   "prefix cache are not pending any more", rule="prefix hits skipped")
            if any(r is a for a in admitted) and s.request_id in cached_before and s.start != cached_before[s.request_id]:
                broke("prefix hits skipped",
                      f"{where}: {s.request_id} was admitted starting at token {s.start}, but its first "
                      f"{cached_before[s.request_id]} tokens were served from the cache (self.kv.lookup_prefix "
                      "found their pages): expected it to start right after them (look up its cached pages and "
                      "admit it with them: self._admit(request, n, cached))")
            expect(s.samples == (s.start + s.num_new_tokens == r.num_tokens),
                   f"{where}: {s.request_id}: samples must be True exactly when the chunk reaches the last known "
                   f"token (start {s.start} + {s.num_new_tokens} vs {r.num_tokens} tokens), got {s.samples}")
            if s.start + s.num_new_tokens < r.num_tokens:
                short.append(s)
            if not self.chunked:
                expect(s.num_new_tokens == r.num_tokens - r.num_computed_tokens,
                       f"{where}: enable_chunked_prefill is False but {s.request_id} got a chunk of {s.num_new_tokens} "
                       f"of its {r.num_tokens - r.num_computed_tokens} pending tokens: expected the whole prompt or "
                       "nothing", rule="chunked prefill off")
        if self.chunked and short and total < cfg.max_num_batched_tokens:
            s = short[0]
            broke("token budget",
                  f"{where}: {s.request_id} got a chunk of {s.num_new_tokens} tokens and still has "
                  f"{requests[s.request_id].num_tokens - s.start - s.num_new_tokens} pending, yet the step used only "
                  f"{total} of its {cfg.max_num_batched_tokens}-token budget: expected the budget used up before "
                  "a prompt is cut into chunks")
        skipped = [r for r in before_running if any(r is x for x in running) and r.request_id not in ids]
        if admitted and skipped:
            broke("running first",
                  f"{where}: running request {skipped[0].request_id} got no tokens while newly admitted "
                  f"{admitted[0].request_id} did: running requests keep their seats and are served first; "
                  "the queue gets only the budget that is left")
        if self.ample and not out.preempted:
            expect(not skipped, f"{where}: running request {skipped[0].request_id if skipped else ''} got no tokens "
                                "although the budget and pages allowed it: every running request advances each step",
                   rule="running first")
            want = min(cfg.max_num_seqs, len(before_running) + len(waiting_before))
            expect(len(live) == want,
                   f"{where}: {len(before_running)} requests were running and {len(waiting_before)} waiting with "
                   f"{cfg.max_num_seqs} seats, so {want} should run after schedule(), but {len(live)} do: "
                   "admit waiting requests into every free seat in the same step (the turnstile), not only when "
                   "the batch is empty or one per step", rule="the turnstile")
        hit_admitted = any(cached_before.get(r.request_id) for r in admitted)
        self._expect_budget_spent(where, out, total, running, skipped, hit_admitted)
        return out

    def _fits(self, pending: int, left: int) -> int:
        """Tokens of `pending` a step with `left` of its budget can still give (0: none): chunked, as many
        as are left; unchunked, all of them or nothing (all of a bigger one when nobody used any)."""
        if self.chunked:
            return min(pending, left)
        return pending if pending <= left or left == self.engine.config.max_num_batched_tokens else 0

    def _expect_budget_spent(self, where, out, total, running, skipped, hit_admitted=False):
        """Rules 3 and 4 in every scenario: budget left at the end of a step that preempted nobody means
        nobody who could use it was passed over, neither a running request nor the head of the queue.
        (A step that preempted is left to rules 6 and 8: what its pages allowed is not known here.)
        `running`: the scheduler's running list after schedule()."""
        sched, cfg = self.sched, self.engine.config
        if out.preempted:
            return
        kv = sched.kv
        left = cfg.max_num_batched_tokens - total
        for r in skipped:
            pending = r.num_tokens - r.num_computed_tokens
            if self._fits(pending, left) and kv.can_allocate(r, pending):
                broke("running first",
                      f"{where}: running request {r.request_id} ({pending} token(s) pending) got no tokens although "
                      f"{left} of the step's {cfg.max_num_batched_tokens}-token budget was left and pages were free: "
                      "expected every running request to advance, in seat order, while the budget allows")
        if len(running) >= cfg.max_num_seqs:
            return
        waiting = sched.waiting
        if not waiting:
            return
        head = waiting[0]
        # Its cached pages count for nothing: course_lib's lookup moves no counter and takes no reference.
        cached = kv.lookup_prefix(head)
        pending = head.num_tokens - len(cached) * kv.page_size
        n = self._fits(pending, left)
        # Pages for all its pending tokens, not just the chunk: then every reading of "the pages allow" agrees.
        if n and kv.can_allocate(head, pending, cached) and self.admission.allows(head, running):
            alone = (" (chunking off: a prompt bigger than the whole budget runs alone, in a step where nobody "
                     "else used any budget)") if not self.chunked and pending > cfg.max_num_batched_tokens else ""
            hits = (" (tokens served from the prefix cache are not computed, so they cost no budget: neither the "
                    "head's cached tokens nor those of a request admitted before it in this step)") if hit_admitted or cached else ""
            broke("chunked prefill off" if alone else "prefix hits skipped" if hits else "the turnstile",
                  f"{where}: {len(running)} of {cfg.max_num_seqs} seats taken, {left} of the "
                  f"{cfg.max_num_batched_tokens}-token budget left and pages free, yet the head of the queue "
                  f"{head.request_id} ({pending} token(s) pending"
                  + ("" if self.chunked else ", chunking off") + f") was not admitted: expected it to start "
                  f"with {n} tokens in this step (a free seat is refilled while the budget and the pages allow)"
                  + alone + hits)

    def after_step(self, engine):
        sched, kv, pool = self.sched, engine.kv, engine.pool
        where = f"{self.scenario}, after step {self.step - 1}"
        for r in sched.running:
            if r.is_finished:
                broke("retire at once",
                      f"{where}: finished request {r.request_id} is still in self.running: finish(request) must "
                      "remove it (that frees its seat for the next waiting request)")
        for r in engine.requests.values():
            if r.is_finished and r.request_id in kv.tables:
                broke("retire at once",
                      f"{where}: request {r.request_id} finished but still holds {len(kv.tables[r.request_id].pages)} "
                      "KV pages: finish(request) must give them back at once")
        held = sum(len(t.pages) for t in kv.tables.values())
        used = pool.num_pages - pool.num_free_pages
        if engine.prefix_cache is None:
            expect(held + pool.num_free_pages == pool.num_pages,
                   f"{where}: requests hold {held} pages and {pool.num_free_pages} are free, but the pool has "
                   f"{pool.num_pages}: pages leaked", rule="retire at once")
        else:  # shared pages count once in the pool
            expect(used <= held, f"{where}: {used} pages are in use but requests hold only {held}: pages leaked",
                   rule="retire at once")


def _add_all(engine, specs):
    for i, spec in enumerate(specs):
        prompt, out_len = (spec if isinstance(spec[0], list) else ([5] * spec[0], spec[1]))
        engine.add_request(list(prompt), SamplingParams(max_tokens=out_len), request_id=f"r{i}",
                           scripted_output_len=out_len)


def _scripted_engine(impl, config: EngineConfig, admission, specs, scenario, ample, chunked=True):
    engine = LLMEngine(fixtures.scripted_model_config(), config, scheduler=impl, admission=admission)
    inspector = _Inspector(engine, scenario, ample, chunked, admission)
    _add_all(engine, specs)
    return engine, inspector, RunnerLedger(engine)


def _drive(engine, who: str, max_steps: int, on_step=None) -> None:
    """`drive`, naming this notebook's rules: running out of pages, and a request that starves."""
    drive(engine, who, max_steps, on_step, out_of_pages=(
        "never out of pages", "The pool ran out of pages: before a running request grows, make room for it "
        "(self._make_room preempts the youngest); a waiting request starts only if self.kv.can_allocate says its "
        "pages are free"), stalled=(
        "nobody starves", " (the check's cap; the reference needs far fewer): a request that is never served, never "
        "admitted or never retired starves"))


def _finish_checks(engine, scenario, specs, ledger):
    for i, spec in enumerate(specs):
        r = engine.requests[f"r{i}"]
        expect(r.is_finished and r.num_output_tokens == spec[1],
               f"{scenario}: request r{i} should have finished with {spec[1]} tokens, got {r.num_output_tokens} "
               f"({r.status.value})", rule="nobody starves")
    # The requests' own fields are within the scheduler's reach: hold them to what the engine's runner produced.
    ledger.expect_requests_match(engine, f"StudentScheduler ({scenario})")
    sched = engine.scheduler
    expect(not sched.running and not sched.waiting,
           f"{scenario}: after every request finished, {len(sched.running)} remain in self.running and "
           f"{len(sched.waiting)} in self.waiting", rule="retire at once")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{scenario}: after every request finished only {engine.pool.num_free_pages} of "
           f"{engine.pool.num_pages} pages are free: finish(request) must free the request's pages",
           rule="retire at once")


def _run_scripted(impl, name, allow, config, admission, specs, scenario, ample, chunked=True):
    engine, inspector, ledger = _scripted_engine(impl, config, admission, specs, scenario, ample, chunked)
    with forbid_calls(name, _reference_modules(), enabled=not allow):
        _drive(engine, f"{name} ({scenario})", max_steps=800, on_step=inspector.after_step)
    _finish_checks(engine, scenario, specs, ledger)
    return engine, inspector


def _prefix_specs(rng):
    """Prompts sharing a 12-token prefix (3 pages of 4), each with its own tail."""
    shared = [rng.randrange(3, 60) for _ in range(12)]
    return [(shared + [rng.randrange(3, 60) for _ in range(rng.randint(1, 9))], rng.randint(2, 6)) for _ in range(6)]


def _reference_hits(config, specs) -> int:
    """The prefix-cache hit counter course_lib's scheduler reaches on the same scenario."""
    from course_lib.scheduler.continuous import ContinuousScheduler

    engine = LLMEngine(fixtures.scripted_model_config(), config, scheduler=ContinuousScheduler,
                       admission=_SpyAdmission())
    _add_all(engine, specs)
    while engine.has_unfinished_requests:
        engine.step()
    return engine.prefix_cache.hit_tokens


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

    # 2b. A budget smaller than the seats: every step runs out of budget mid-batch, down to its last
    #     token (which the next running request, or the head's one-token chunk, must still get).
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=3, admission="none"),
                  _SpyAdmission(), [(1, 6), (2, 6), (1, 6), (2, 5), (1, 4)], "budget of 3 tokens, 4 seats",
                  ample=False)

    # 3. Chunked prefill switched off: a prompt is scheduled whole or not at all, and one bigger than the
    #    whole budget runs in a step of its own (else it would wait forever).
    specs = [(rng.randint(20, 30), rng.randint(2, 6)) for _ in range(3)]
    specs.insert(rng.randint(1, 3), (rng.randint(70, 90), rng.randint(2, 4)))
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=64, admission="none",
                               enable_chunked_prefill=False),
                  _SpyAdmission(), specs, "enable_chunked_prefill=False, budget 64, one prompt longer than 64",
                  ample=False, chunked=False)

    # 3b. Chunked prefill off, an exact fit: a 10- and a 54-token prompt fill the first step's 64 tokens
    #     together (a prompt exactly as long as the budget left still fits).
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=64, admission="none",
                               enable_chunked_prefill=False),
                  _SpyAdmission(), [(10, 3), (54, 3)],
                  "enable_chunked_prefill=False, budget 64, prompts of 10 and 54 tokens", ample=False, chunked=False)

    # 4. The admission policy is obeyed.
    spy = _SpyAdmission(limit=2)
    specs = [(rng.randint(2, 8), rng.randint(2, 8)) for _ in range(6)]
    engine, _ = _run_scripted(impl, name, allow_reference,
                              EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=256),
                              spy, specs, "an admission policy allowing 2 running requests", ample=False)
    expect(spy.calls > 0, f"{name}.schedule() never asked self.admission.can_admit(request, n, cached_pages, "
                          "self.kv, self.running) before admitting a request", rule="the policy decides")
    peak = max(s.num_running for s in engine.step_stats)
    expect(peak <= 2, f"{name} admitted a request although self.admission.can_admit(...) returned False (expected "
                      f"at most 2 running, got {peak}): stop admitting when it says no", rule="the policy decides")

    # 5. First come, first served: a policy refuses the long prompt at the head of the queue while anyone
    #    runs; the short requests behind it must wait too.
    picky = _PickyAdmission(longest=10)
    specs = [(rng.randint(2, 6), rng.randint(6, 10)), (rng.randint(14, 20), rng.randint(2, 4))]
    specs += [(rng.randint(2, 6), rng.randint(2, 6)) for _ in range(3)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=256),
                  picky, specs, "the head of the queue refused by the admission policy", ample=False)
    expect(picky.refused, f"{name}: the policy was never asked about r1 (a long prompt queued behind a running "
                          "request): expected can_admit to be asked for the head of the queue, got no call",
           rule="the policy decides")

    # 5b. First come, first served when the head lacks pages: a 12-page pool, r0 decoding and growing, r1's
    #     prompt needs more pages than are free until r0 is done; the short requests behind r1 wait too.
    specs = [(rng.randint(17, 20), rng.randint(8, 10)), (rng.randint(29, 32), rng.randint(2, 3))]
    specs += [(rng.randint(2, 4), rng.randint(2, 4)) for _ in range(2)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=12, max_num_seqs=4, max_num_batched_tokens=256, admission="none"),
                  _SpyAdmission(), specs, "12-page pool, the head of the queue lacks pages", ample=False)

    # 6. A pool too small for everyone: make room by preempting (never run out of pages), and admit
    #    nobody in a step that had to preempt.
    specs = [(8, 14), (8, 14), (rng.randint(6, 9), rng.randint(10, 14)), (2, 3), (2, 3), (2, 3)]
    _, inspector = _run_scripted(impl, name, allow_reference,
                                 EngineConfig(page_size=4, num_pages=10, max_num_seqs=4, max_num_batched_tokens=6,
                                              admission="none"),
                                 _SpyAdmission(), specs, "a 10-page pool (preemption needed)", ample=False)
    expect(inspector.preempting_steps > 0,
           f"{name}: 6 requests needing up to 6 pages each shared a 10-page pool, yet no step preempted: "
           "expected the youngest running request to give its pages back (self._make_room) when a running "
           "request cannot grow", rule="never out of pages")

    # 6b. _make_room says no: a 3-page pool, r0 (a short prompt, room left in its page) and r1 (8 tokens, two
    #     full pages) fill it; r1's first decode needs a third page, none is free, and r1 is the youngest: making
    #     room preempts r1 itself (False), and r1 gets nothing in that step.
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=3, max_num_seqs=2, max_num_batched_tokens=64, admission="none"),
                  _SpyAdmission(), [(rng.randint(1, 3), rng.randint(5, 8)), (8, rng.randint(2, 4))],
                  "a 3-page pool, the youngest must preempt itself", ample=False)

    # 7. Prefix caching on: a waiting request starts from its cached pages (kv.lookup_prefix), those tokens
    #    are not computed again, and the hit counter is exactly what course_lib's scheduler reaches.
    specs = _prefix_specs(rng)
    config = EngineConfig(page_size=4, num_pages=200, max_num_seqs=2, max_num_batched_tokens=64, admission="none",
                          enable_prefix_caching=True)
    want_hits = _reference_hits(config, specs)
    engine, _ = _run_scripted(impl, name, allow_reference, config, _SpyAdmission(), specs,
                              "prefix caching on, 6 prompts sharing 12 tokens, 2 seats", ample=True)
    got_hits = engine.prefix_cache.hit_tokens
    expect(got_hits == want_hits,
           f"{name} with prefix caching on (6 prompts sharing their first 12 tokens, 2 seats): expected "
           f"{want_hits} prompt tokens served from the cache, got {got_hits}: look up a waiting request's cached "
           "pages with self.kv.lookup_prefix(request) and admit it with them (self._admit(request, n, cached))",
           rule="prefix hits skipped")

    # 7b. Prefix caching under a tight budget: tokens served from the cache are not computed, so they cost
    #     no budget; a scheduler that charges them admits fewer requests than the budget allows.
    shared = [rng.randrange(3, 60) for _ in range(12)]
    specs = [(shared + [rng.randrange(3, 60) for _ in range(rng.randint(1, 3))], rng.randint(6, 9)) for _ in range(5)]
    _run_scripted(impl, name, allow_reference,
                  EngineConfig(page_size=4, num_pages=200, max_num_seqs=4, max_num_batched_tokens=10, admission="none",
                               enable_prefix_caching=True),
                  _SpyAdmission(), specs, "prefix caching on, a budget of 10 tokens, 5 prompts sharing 12 tokens",
                  ample=False)

    # 8. Real tokens: the float64 model served through the scheduler equals the dense model.
    model = fixtures.random_model(seed)
    prompts = fixtures.random_prompts(rng, 5, model.config.vocab_size, lo=1, hi=14) + [
        fixtures.random_prompts(rng, 1, model.config.vocab_size, lo=17, hi=20)[0]]
    want = fixtures.greedy(model, prompts, 8)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=14, max_num_seqs=4, max_num_batched_tokens=16,
                                           admission="none"), scheduler=impl)
    ledger = RunnerLedger(engine)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=8), request_id=f"r{i}")
    with forbid_calls(name, _reference_modules(), enabled=not allow_reference):
        _drive(engine, f"{name} (float64 model, 14-page pool)", max_steps=400)
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name}: serving the float64 model, request r{i} (prompt of {len(prompts[i])} tokens) produced {got}, but "
        f"the model's greedy answer is {w}: a chunk or a decode was scheduled with the wrong start / number of "
        "tokens, or a request resumed from the wrong point"), rule="identical answers")
    ledger.expect_requests_match(engine, f"{name} (float64 model, 14-page pool)")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{name}: after serving the model, {engine.pool.num_pages - engine.pool.num_free_pages} pages are still used",
           rule="retire at once")
