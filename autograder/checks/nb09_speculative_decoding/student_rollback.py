"""Notebook 09, `StudentRollback`: after every step each drafted row against the rule computed from
what the runner returned, and greedy answers at the end."""
from __future__ import annotations

import contextlib
import itertools

from autograder._checking import REFERENCE_MESSAGE, broke, check, drive, expect, fail, show
from course_lib.scheduler.request import FinishReason

from ._shared import _RUNS, _build_engine, _stop_of, _Workload

ROLLBACK = "StudentRollback"


def accept_rule(before: list[int], drafts, targets, params, eos, prompt_len: int, max_len: int):
    """The check's own rollback rule: (tokens appended, finish reason or None)."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == targets[kept]:
        kept += 1
    appended = []
    for token in targets[: kept + 1]:
        appended.append(token)
        reason = _stop_of(token, len(before) + len(appended), params, eos, prompt_len, max_len)
        if reason is not None:
            return appended, reason
    return appended, None


class _StepBook:
    """What the engine's runner did in each step (kept by the check, on the grader's side): every drafted
    row's request, start, drafts, the pages it held and its output before the update, and the target's
    tokens. `check_step` then holds every drafted request to the rule after the update."""

    def __init__(self, engine):
        self.engine = engine
        self.eos = frozenset(engine.model_config.eos_token_ids)  # the model's, as the check built it
        self.rows: list[tuple] = []
        self.freed_pages = 0
        self.stops_inside = 0
        self.kinds: set[int] = set()  # how many drafts were kept, over the whole run
        execute = engine.runner.execute

        def execute_and_note(out):
            rows = []
            for s in out.scheduled:
                if s.draft_token_ids:
                    r = engine.requests[s.request_id]
                    rows.append((s.request_id, s.start, tuple(s.draft_token_ids),
                                 list(engine.kv.tables[s.request_id].pages), list(r.output_token_ids)))
            sampled = execute(out)
            self.rows = [(rid, start, drafts, pages, before, [int(t) for t in sampled[rid]])
                         for rid, start, drafts, pages, before in rows]
            return sampled

        engine.runner.execute = execute_and_note

    def check_step(self, who: str, step: int) -> None:
        engine = self.engine
        kv, pool = engine.kv, engine.pool
        max_len = kv.max_model_len
        for rid, start, drafts, pages, before, targets in self.rows:
            r = engine.requests[rid]
            params = r.sampling_params
            want, reason = accept_rule(before, drafts, targets, params, self.eos, len(r.prompt_token_ids), max_len)
            kept = 0
            while kept < len(drafts) and drafts[kept] == targets[kept]:
                kept += 1
            self.kinds.add(kept)
            shown = (f"{who}, step {step}: request {rid} (output so far {len(before)} tokens, progress {start}) drafted "
                     f"{list(drafts)}, the target's tokens at its {len(targets)} positions were {targets}")
            got = r.output_token_ids[len(before):] if r.output_token_ids[: len(before)] == before else None
            if got is None:
                broke("the agreeing prefix", f"{shown}: its earlier output changed (it was {before[-6:]} at the end, now "
                      f"{r.output_token_ids[-6:]}): append to request.output_token_ids, never rewrite it")
            if got != want:
                if reason is not None and len(got) > len(want) and got[: len(want)] == want:
                    broke("stop where the answer stops",
                          f"{shown}: it appended {got}, but {want[-1]} ends the request ({_why(reason, params)}): append "
                          f"{want} and stop there, the tokens after a stop are never part of the answer")
                if len(got) < len(want) and got == want[: len(got)] and r.is_finished:
                    broke("stop where the answer stops",
                          f"{shown}: it appended {got} and the request finished ({show(r.finish_reason)}); expected "
                          f"{want}: {got[-1] if got else 'nothing'} ends nothing (stop tokens "
                          f"{list(params.stop_token_ids)}, EOS {sorted(self.eos)}, ignore_eos={params.ignore_eos}, "
                          f"max_tokens {params.max_tokens}, max_model_len {max_len})")
                broke("the agreeing prefix",
                      f"{shown}: it appended {got}, expected {want} ({kept} draft(s) agree with the target's tokens, so "
                      f"the output gains {'those and ' if kept else ''}the target's token at position {kept}"
                      + (f", cut at the stop {want[-1]}" if reason is not None else "") + ")")
            if reason is not None:
                expect(r.is_finished and r.finish_reason is reason,
                       lambda: f"{shown}: it appended {want}, and {want[-1]} ends the request ({_why(reason, params)}): "
                               f"accept_drafts must return {reason} (a FinishReason), got the request "
                               + (f"finished with {show(r.finish_reason)}" if r.is_finished else "still running"),
                       rule="stop where the answer stops")
                if len(want) < kept + 1:
                    self.stops_inside += 1
                continue
            expect(not r.is_finished, lambda: f"{shown}: it appended {want}, which ends nothing, but the request finished "
                                              f"({show(r.finish_reason)}): return None when no token stops it",
                   rule="stop where the answer stops")
            progress = start + len(want)
            expect(r.num_computed_tokens == progress,
                   lambda: f"{shown}: it appended {len(want)} token(s); its progress must be {start} + {len(want)} = "
                           f"{progress} (the K/V of its last token and of the {len(want) - 1} kept draft(s) is written; "
                           f"the rejected drafts' is not, and the newest token's is computed next step), got "
                           f"num_computed_tokens = {show(r.num_computed_tokens)}",
                   rule="progress counts kept tokens")
            table = kv.tables.get(rid)
            keep = kv.pages_to_hold(progress)
            held = list(table.pages) if table is not None else None
            expect(held == pages[:keep],
                   lambda: f"{shown}: the step held pages {pages} (page size {kv.page_size}); with progress {progress} "
                           f"it must keep {pages[:keep]} and give back {pages[keep:] or 'none'}, but its page table is "
                           f"{held}", rule="rejected pages go back")
            expect(kv.filled.get(rid) == progress,
                   lambda: f"{shown}: the KV manager counts {kv.filled.get(rid)} filled slots for it, not {progress}: give "
                           "the pages back through the manager (self.kv.truncate(request, num_tokens)), not the pool",
                   rule="rejected pages go back")
            for page in pages[keep:]:
                expect(pool.ref_counts[page] == 0 and pool.is_free(page),
                       lambda: f"{shown}: page {page} held only rejected drafts and must be free again, it has "
                               f"{pool.ref_counts[page]} owner(s)", rule="rejected pages go back")
            self.freed_pages += len(pages) - keep
        held = sum(1 for rc in pool.ref_counts if rc > 0)
        expect(held + pool.num_free_pages == pool.num_pages,
               f"{who}, step {step}: {held} pages held + {pool.num_free_pages} free != {pool.num_pages} in the pool: a "
               "page was lost or freed twice", rule="rejected pages go back")


def _why(reason, params) -> str:
    return {FinishReason.STOP: f"it is a stop token of the request, {list(params.stop_token_ids)}",
            FinishReason.EOS: "it is the model's EOS and the request does not ignore it",
            FinishReason.LENGTH: "the request reaches its length limit (max_tokens or max_model_len)"}.get(reason, str(reason))


def _scheduler_classes():
    from course_lib.scheduler.base import SchedulerBase
    from course_lib.scheduler.continuous import ContinuousScheduler

    return ContinuousScheduler, SchedulerBase


@contextlib.contextmanager
def _reference_rollback_forbidden(enabled: bool):
    """While the block runs, course_lib's own accept_drafts fails if called (an override that delegates to
    it with super() hands in the reference)."""
    if not enabled:
        yield
        return
    base = _scheduler_classes()[1]
    saved = base.__dict__["accept_drafts"]

    def stub(self, *args, **kwargs):
        fail(f"{ROLLBACK} {REFERENCE_MESSAGE} (its accept_drafts calls course_lib's SchedulerBase.accept_drafts)")

    try:
        base.accept_drafts = stub
        yield
    finally:
        base.accept_drafts = saved


def _rollback_run(impl, seed, label, spec, allow):
    work = _Workload(seed, spec)
    engine = _build_engine(work, spec, seed, scheduler=impl)
    book = _StepBook(engine)
    who = f"{ROLLBACK} ({label})"
    with _reference_rollback_forbidden(not allow):
        steps = itertools.count()
        drive(engine, who, max_steps=300, on_step=lambda _engine: book.check_step(who, next(steps)))
    for rid, (want, reason) in work.expected.items():
        r = engine.requests[rid]
        expect(r.output_token_ids == want,
               lambda: f"{who}: request {rid} produced {r.output_token_ids}; decoding without drafts gives {want}",
               rule="the agreeing prefix")
        expect(r.finish_reason is reason, lambda: f"{who}: request {rid} finished with {show(r.finish_reason)}, "
                                                  f"expected {reason}", rule="stop where the answer stops")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{who}: after every request finished, {engine.pool.num_pages - engine.pool.num_free_pages} page(s) are still "
           "held", rule="rejected pages go back")
    drafter = engine.scheduler.drafter
    # The run must have shown every case the rules are about (the workloads are built so that it does).
    expect(len(drafter.log) > 0 and engine.scheduler.num_draft_tokens > 0,
           f"{who}: no drafted row was scheduled: keep ContinuousScheduler's schedule() (only accept_drafts is yours)")
    expect({0, spec["k"]} <= book.kinds and book.freed_pages > 0 and book.stops_inside > 0,
           f"{who} (internal): the run missed a case (kept counts {sorted(book.kinds)}, pages given back "
           f"{book.freed_pages}, stops inside drafts {book.stops_inside})")
    return engine


@check(ROLLBACK, allowed_bases=_scheduler_classes)
def check_StudentRollback(impl, seed, allow_reference):
    # Names, not issubclass: through the grading membrane the class is a stand-in whose attributes cross.
    bases = [k.__name__ for k in impl.__mro__] if isinstance(impl, type) else []
    expect("ContinuousScheduler" in bases,
           f"{ROLLBACK} must be a class built on ContinuousScheduler (class {ROLLBACK}(ContinuousScheduler)), got "
           f"{impl!r}")
    owner = getattr(getattr(impl, "accept_drafts", None), "__qualname__", "").split(".")[0]
    expect(owner not in ("", "ContinuousScheduler", "SchedulerBase"),
           f"{ROLLBACK} {REFERENCE_MESSAGE} (its accept_drafts is still course_lib's {owner}.accept_drafts: define your "
           "own in the class)")
    schedule_owner = getattr(getattr(impl, "schedule", None), "__qualname__", "").split(".")[0]
    expect(schedule_owner == "ContinuousScheduler",
           f"{ROLLBACK} must keep ContinuousScheduler's schedule() (it schedules the drafted rows); yours is "
           f"{schedule_owner}.schedule")
    for label, spec in _RUNS.items():
        _rollback_run(impl, seed, label, spec, allow_reference)
