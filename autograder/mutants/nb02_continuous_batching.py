"""Realistic wrong answers for notebook 02 (continuous batching). Self-contained: no autograder imports."""
from course_lib.scheduler.base import SchedulerBase
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput


class _Scheduler(SchedulerBase):
    """A correct turnstile; each mutant below breaks one rule of it."""

    def schedule(self):
        out = SchedulerOutput()
        budget = self._serve_running(out, self.max_num_batched_tokens)
        self._admit_waiting(out, budget)
        return out

    def _serve_running(self, out, budget):
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = self._chunk(request.num_pending_tokens, budget)
            if n == 0:
                break
            if not self._room(request, n, out):
                break
            self.kv.allocate(request, n)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
            i += 1
        return budget

    def _room(self, request, n, out):
        return self._make_room(request, n, out)

    def _admit_waiting(self, out, budget):
        while self._may_admit(out, budget):
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0 or not self.kv.can_allocate(request, n, cached):
                break
            if not self._policy_allows(request, n, cached):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
            if self._one_per_step():
                break
        return budget

    def _may_admit(self, out, budget):
        return self.waiting and not out.preempted and len(self.running) < self.max_num_seqs and budget > 0

    def _policy_allows(self, request, n, cached):
        return self.admission.can_admit(request, n, cached, self.kv, self.running)

    def _one_per_step(self):
        return False

    def _chunk(self, pending, budget):
        if self.enable_chunked_prefill:
            return min(pending, budget)
        if pending <= budget or budget == self.max_num_batched_tokens:
            return pending
        return 0

    @staticmethod
    def _entry(request, n):
        start = request.num_computed_tokens
        return ScheduledRequest(request.request_id, n, start, start + n == request.num_tokens)

    def finish(self, request):
        self.running.remove(request)
        self.kv.free(request)
        return [request]


class NeverRetires(_Scheduler):
    """finish() delivers the request but leaves it in self.running, holding its seat and pages."""

    def finish(self, request):
        return [request]


class LeaksPages(_Scheduler):
    """finish() frees the seat but not the request's KV pages."""

    def finish(self, request):
        self.running.remove(request)
        return [request]


class WaitsForEmptyBatch(_Scheduler):
    """Admits only when nobody is running: a static batch in disguise."""

    def schedule(self):
        out = SchedulerOutput()
        busy = any(r.finish_reason is None for r in self.running)
        budget = self._serve_running(out, self.max_num_batched_tokens)
        if not busy:
            self._admit_waiting(out, budget)
        return out


class OneAdmissionPerStep(_Scheduler):
    """Fills at most one free seat per step (an `if` where a `while` belongs)."""

    def _one_per_step(self):
        return True


class IgnoresTokenBudget(_Scheduler):
    """Schedules every pending token, however many: no chunking, no budget."""

    def _chunk(self, pending, budget):
        return pending


class NoPreemption(_Scheduler):
    """Allocates without making room: runs into OutOfPages when the pool is full."""

    def _room(self, request, n, out):
        return True


class AdmitsBeforeRunning(_Scheduler):
    """Fills the queue's requests first; running requests get whatever budget is left."""

    def schedule(self):
        out = SchedulerOutput()
        old = list(self.running)
        budget = self._admit_waiting(out, self.max_num_batched_tokens)
        new = [r for r in self.running if r not in old]
        self.running = old  # serve only the requests that were running before
        budget = self._serve_running(out, budget)
        self.running += [r for r in new if r not in self.running]
        return out


class IgnoresAdmissionPolicy(_Scheduler):
    """Never asks self.admission.can_admit."""

    def _policy_allows(self, request, n, cached):
        return True


class AlwaysChunks(_Scheduler):
    """Chunks prompts even when enable_chunked_prefill is False."""

    def _chunk(self, pending, budget):
        return min(pending, budget)


class AdmitsAfterPreempting(_Scheduler):
    """Keeps admitting from the queue in a step that had to preempt (the pool is full: thrashing)."""

    def _may_admit(self, out, budget):
        return self.waiting and len(self.running) < self.max_num_seqs and budget > 0


class SkipsRefusedHead(_Scheduler):
    """When the head of the queue cannot start, looks further down the queue (overtaking it)."""

    def _admit_waiting(self, out, budget):
        for request in list(self.waiting):
            if out.preempted or len(self.running) >= self.max_num_seqs or budget <= 0:
                break
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0 or not self.kv.can_allocate(request, n, cached) or not self._policy_allows(request, n, cached):
                continue
            self.waiting.remove(request)
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
        return budget


class IgnoresPrefixCache(_Scheduler):
    """Never looks up cached pages: every prompt is computed from scratch."""

    def _admit_waiting(self, out, budget):
        lookup = self.kv.lookup_prefix
        self.kv.lookup_prefix = lambda request: []
        try:
            return super()._admit_waiting(out, budget)
        finally:
            self.kv.lookup_prefix = lookup


class PendingCountsCachedTokens(_Scheduler):
    """Uses the cached pages but still schedules the whole prompt, cached tokens included."""

    def _admit_waiting(self, out, budget):
        while self._may_admit(out, budget):
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens, budget)
            if n == 0 or not self.kv.can_allocate(request, n, cached) or not self._policy_allows(request, n, cached):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
        return budget


class EntryBeforeAdmitting(_Scheduler):
    """Builds the SchedulerOutput entry before admitting: a prefix hit's start is then wrong."""

    def _admit_waiting(self, out, budget):
        while self._may_admit(out, budget):
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0 or not self.kv.can_allocate(request, n, cached) or not self._policy_allows(request, n, cached):
                break
            entry = self._entry(request, n)
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(entry)
            budget = max(0, budget - n)
        return budget


class BigPromptWaitsForever(_Scheduler):
    """With chunking off, a prompt larger than the whole budget never gets a step of its own."""

    def _chunk(self, pending, budget):
        if self.enable_chunked_prefill:
            return min(pending, budget)
        return pending if pending <= budget else 0


class ChunksBelowTheBudget(_Scheduler):
    """Cuts prompts into chunks of at most half the budget, leaving the rest of the step unused."""

    def _chunk(self, pending, budget):
        if self.enable_chunked_prefill:
            return min(pending, budget, max(1, self.max_num_batched_tokens // 2))
        return super()._chunk(pending, budget)


class ExactFitWaits(_Scheduler):
    """With chunking off, a prompt exactly as long as the budget left is refused (< where <= is meant)."""

    def _chunk(self, pending, budget):
        if self.enable_chunked_prefill:
            return min(pending, budget)
        return pending if pending < budget or budget == self.max_num_batched_tokens else 0


class LastTokenOfBudgetUnused(_Scheduler):
    """Stops serving once a single token of budget is left (budget > 1 where budget > 0 is meant): the
    last running decode, or the head's one-token chunk, waits for the next step."""

    def _serve_running(self, out, budget):
        i = 0
        while i < len(self.running) and budget > 1:
            request = self.running[i]
            n = self._chunk(request.num_pending_tokens, budget)
            if n == 0 or not self._room(request, n, out):
                break
            self.kv.allocate(request, n)
            out.scheduled.append(self._entry(request, n))
            budget -= n
            i += 1
        return budget

    def _may_admit(self, out, budget):
        return super()._may_admit(out, budget) and budget > 1


def occupancy_unweighted(step_stats, max_num_seqs):
    """Averages over steps without weighting by their durations."""
    if not step_stats:
        return 0.0
    return sum(s.num_running for s in step_stats) / (max_num_seqs * len(step_stats))


def occupancy_as_a_tensor(step_stats, max_num_seqs):
    """Right weights and seats, computed with torch: returns a 0-d tensor, not a number."""
    import torch

    if not step_stats:
        return torch.tensor(0.0)
    running = torch.tensor([float(s.num_running) for s in step_stats])
    w = torch.tensor([max(0.0, s.end_time - s.start_time) for s in step_stats])
    if w.sum() == 0:
        w = torch.ones_like(w)
    return (w * running).sum() / (max_num_seqs * w.sum())


def occupancy_not_a_fraction(step_stats, max_num_seqs):
    """The time-weighted mean number of running requests, not divided by the seats."""
    if not step_stats:
        return 0.0
    w = [max(0.0, s.end_time - s.start_time) for s in step_stats]
    if sum(w) == 0:
        w = [1.0] * len(step_stats)
    return sum(wi * s.num_running for wi, s in zip(w, step_stats)) / sum(w)


def occupancy_counts_waiting(step_stats, max_num_seqs):
    """Counts waiting requests as if they held seats."""
    if not step_stats:
        return 0.0
    w = [max(0.0, s.end_time - s.start_time) for s in step_stats]
    if sum(w) == 0:
        w = [1.0] * len(step_stats)
    return sum(wi * (s.num_running + s.num_waiting) for wi, s in zip(w, step_stats)) / (max_num_seqs * sum(w))


def occupancy_no_fallback(step_stats, max_num_seqs):
    """Divides by the total duration even when it is 0 (untimed steps)."""
    if not step_stats:
        return 0.0
    w = [s.end_time - s.start_time for s in step_stats]
    return sum(wi * s.num_running for wi, s in zip(w, step_stats)) / (max_num_seqs * sum(w))


def occupancy_empty_crashes(step_stats, max_num_seqs):
    """Correct, except for a run without steps."""
    w = [max(0.0, s.end_time - s.start_time) for s in step_stats]
    if sum(w) == 0:
        w = [1.0] * len(step_stats)
    return sum(wi * s.num_running for wi, s in zip(w, step_stats)) / (max_num_seqs * sum(w))


def occupancy_over_span(step_stats, max_num_seqs):
    """Divides the seat-seconds by the run's span (first start to last end): idle gaps between steps count
    as empty seats."""
    if not step_stats:
        return 0.0
    seated = sum((s.end_time - s.start_time) * s.num_running for s in step_stats)
    span = step_stats[-1].end_time - step_stats[0].start_time
    if span == 0:
        return sum(s.num_running for s in step_stats) / (max_num_seqs * len(step_stats))
    return seated / (max_num_seqs * span)


def occupancy_any_untimed_equal(step_stats, max_num_seqs):
    """Falls back to equal weights as soon as ANY step has no duration (`any` where `all` is meant)."""
    if not step_stats:
        return 0.0
    w = [s.end_time - s.start_time for s in step_stats]
    if any(wi == 0 for wi in w):
        w = [1.0] * len(step_stats)
    return sum(wi * s.num_running for wi, s in zip(w, step_stats)) / (max_num_seqs * sum(w))



class OvertakesHeadWithoutPages(_Scheduler):
    """When the head of the queue lacks pages, admits the requests behind it that fit (the policy's "no"
    still stops the queue): first come, first served broken only where pages run short."""

    def _admit_waiting(self, out, budget):
        for request in list(self.waiting):
            if not self._may_admit(out, budget):
                break
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0:
                break
            if not self.kv.can_allocate(request, n, cached):
                continue  # the head lacks pages: try the next one
            if not self._policy_allows(request, n, cached):
                break
            self.waiting.remove(request)
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
        return budget


class IgnoresMakeRoomRefusal(_Scheduler):
    """Calls _make_room but goes on when it says no: the request that just preempted itself is still
    allocated and scheduled."""

    def _room(self, request, n, out):
        self._make_room(request, n, out)
        return True


class ChargesCachedTokens(_Scheduler):
    """Charges a newly admitted request's whole prompt to the budget, its cached tokens included."""

    def _admit_waiting(self, out, budget):
        while self._may_admit(out, budget):
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0 or not self.kv.can_allocate(request, n, cached) or not self._policy_allows(request, n, cached):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n - len(cached) * self.kv.page_size)
        return budget

MUTANTS = {
    "StudentScheduler": [NeverRetires, LeaksPages, WaitsForEmptyBatch, OneAdmissionPerStep, IgnoresTokenBudget,
                         NoPreemption, AdmitsBeforeRunning, IgnoresAdmissionPolicy, AlwaysChunks,
                         AdmitsAfterPreempting, SkipsRefusedHead, IgnoresPrefixCache, PendingCountsCachedTokens,
                         EntryBeforeAdmitting, BigPromptWaitsForever, ChunksBelowTheBudget, ExactFitWaits,
                         LastTokenOfBudgetUnused, OvertakesHeadWithoutPages, IgnoresMakeRoomRefusal,
                         ChargesCachedTokens],
    "mean_batch_occupancy": [occupancy_unweighted, occupancy_not_a_fraction, occupancy_counts_waiting,
                             occupancy_no_fallback, occupancy_empty_crashes, occupancy_over_span,
                             occupancy_any_untimed_equal, occupancy_as_a_tensor],
}


# ---------------------------------------------------------------------------------------------
# budget_sweep: each mutant is the correct measurement with one mistake
# ---------------------------------------------------------------------------------------------


def _serve(engine, specs, submit, all_at_once=False, stamp_at_start=False, strictly_after=False):
    """{request id: [arrival, token times...]} (correct unless told otherwise)."""
    clock = engine.clock
    queue = sorted(specs, key=lambda s: s.arrival_time)
    times = {}
    if all_at_once:
        for spec in queue:
            submit(engine, spec)
            times[spec.request_id] = [spec.arrival_time]
        queue = []
    i = 0
    while i < len(queue) or engine.has_unfinished_requests:
        while i < len(queue) and (queue[i].arrival_time < clock.now() if strictly_after
                                  else queue[i].arrival_time <= clock.now()):
            submit(engine, queue[i])
            times[queue[i].request_id] = [queue[i].arrival_time]
            i += 1
        if not engine.has_unfinished_requests:
            clock.wait_until(queue[i].arrival_time)
            continue
        before = clock.now()
        for out in engine.step():
            stamp = before if stamp_at_start else clock.now()
            times[out.request_id] += [stamp] * len(out.new_token_ids)
    return times


def _row(budget, times, gaps_from_arrival=False, per_request_mean=False, seconds=False):
    import numpy as np

    scale = 1.0 if seconds else 1e3
    ttft = [t[1] - t[0] for t in times.values()]
    if per_request_mean:
        gaps = [(t[-1] - t[1]) / (len(t) - 2) for t in times.values() if len(t) > 2]
    else:
        first = 0 if gaps_from_arrival else 1
        gaps = [b - a for t in times.values() for a, b in zip(t[first:], t[first + 1:])]
    return {"budget": budget,
            "ttft_p50_ms": scale * float(np.percentile(ttft, 50)), "ttft_p99_ms": scale * float(np.percentile(ttft, 99)),
            "itl_p50_ms": scale * float(np.percentile(gaps, 50)), "itl_p99_ms": scale * float(np.percentile(gaps, 99))}


def sweep_submits_all_at_once(budgets, specs, make_engine, submit):
    """Puts every request into the engine at t=0, before it has arrived."""
    return [_row(b, _serve(make_engine(b), specs, submit, all_at_once=True)) for b in budgets]


def sweep_gaps_from_arrival(budgets, specs, make_engine, submit):
    """Counts the wait for the first token as an inter-token gap."""
    return [_row(b, _serve(make_engine(b), specs, submit), gaps_from_arrival=True) for b in budgets]


def sweep_tpot_per_request(budgets, specs, make_engine, submit):
    """One mean gap per request (TPOT), not every gap: the long stalls average away."""
    return [_row(b, _serve(make_engine(b), specs, submit), per_request_mean=True) for b in budgets]


def sweep_stamps_step_start(budgets, specs, make_engine, submit):
    """Times each token at the start of the step that produced it."""
    return [_row(b, _serve(make_engine(b), specs, submit, stamp_at_start=True)) for b in budgets]


def sweep_in_seconds(budgets, specs, make_engine, submit):
    """Reports seconds under the *_ms keys."""
    return [_row(b, _serve(make_engine(b), specs, submit), seconds=True) for b in budgets]


def sweep_sorts_budgets(budgets, specs, make_engine, submit):
    """Returns the rows sorted by budget instead of in the order asked."""
    return [_row(b, _serve(make_engine(b), specs, submit)) for b in sorted(budgets)]


def sweep_one_engine(budgets, specs, make_engine, submit):
    """Builds one engine (of the first budget) and measures every budget's row on it."""
    engine = make_engine(budgets[0])
    times = _serve(engine, specs, submit)
    return [_row(b, times) for b in budgets]


def sweep_waits_past_arrival(budgets, specs, make_engine, submit):
    """Submits a request only once the clock has passed its arrival (`<` where `<=` belongs): the idle
    clock jumps to the arrival, the request is still not submitted, and the loop spins for ever."""
    return [_row(b, _serve(make_engine(b), specs, submit, strictly_after=True)) for b in budgets]


MUTANTS["budget_sweep"] = [sweep_waits_past_arrival, sweep_submits_all_at_once, sweep_gaps_from_arrival, sweep_tpot_per_request,
                           sweep_stamps_step_start, sweep_in_seconds, sweep_sorts_budgets, sweep_one_engine]
