"""Notebook 02 continuous_batching: reference solutions. GENERATED from solutions/02_continuous_batching/02_continuous_batching.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


import numpy as np
from course_lib.scheduler.base import SchedulerBase
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput


def entry(request, n: int) -> ScheduledRequest:
    """The SchedulerOutput entry for computing `n` more tokens of `request` this step."""
    start = request.num_computed_tokens
    return ScheduledRequest(request.request_id, n, start, samples=start + n == request.num_tokens)


class StudentScheduler(SchedulerBase):
    """The turnstile: every step, seated requests advance first, then free seats are refilled."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        def tokens_now(pending: int) -> int:
            """As many pending tokens as the budget allows; with chunking off, all or none (a prompt
            bigger than the whole budget may take a step of its own)."""
            if self.enable_chunked_prefill:
                return min(pending, budget)
            return pending if pending <= budget or budget == self.max_num_batched_tokens else 0

        # 1. Seated requests advance: a decode, or the next chunk of a prompt.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = tokens_now(request.num_pending_tokens)
            if n == 0:
                break  # an unchunkable prompt waits for a step with room for all of it
            if not self._make_room(request, n, out):
                break  # it was the youngest, and gave its own pages back
            self.kv.allocate(request, n)
            out.scheduled.append(entry(request, n))
            budget -= n
            i += 1

        # 2. Free seats are refilled from the head of the queue, unless this step had to preempt.
        while self.waiting and not out.preempted and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = tokens_now(request.num_tokens - len(cached) * self.kv.page_size)
            if n == 0 or not self.kv.can_allocate(request, n, cached):
                break  # first come, first served: nobody overtakes the head of the queue
            if not self.admission.can_admit(request, n, cached, self.kv, self.running):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(entry(request, n))  # after admitting: a prefix hit moved its counter
            budget -= n
        return out

    def finish(self, request) -> list:
        """`request` produced its last token: it leaves its seat and gives back its pages at once."""
        self.running.remove(request)
        self.kv.free(request)
        return [request]


def mean_batch_occupancy(step_stats, max_num_seqs: int) -> float:
    """Time-weighted mean of num_running / max_num_seqs over the steps."""
    if not step_stats:
        return 0.0
    weights = [max(0.0, s.end_time - s.start_time) for s in step_stats]
    if sum(weights) == 0:
        weights = [1.0] * len(step_stats)
    seated = sum(w * s.num_running for w, s in zip(weights, step_stats))
    return seated / (max_num_seqs * sum(weights))


def budget_sweep(budgets, specs, make_engine, submit) -> list[dict]:
    """One row per budget: TTFT and inter-token latency (p50, p99, ms) serving `specs` on make_engine(budget)."""
    rows = []
    for budget in budgets:
        engine = make_engine(budget)
        clock = engine.clock
        queue = sorted(specs, key=lambda spec: spec.arrival_time)
        times = {}  # request id -> [arrival, time of token 1, time of token 2, ...]
        i = 0
        while i < len(queue) or engine.has_unfinished_requests:
            while i < len(queue) and queue[i].arrival_time <= clock.now():
                submit(engine, queue[i])
                times[queue[i].request_id] = [queue[i].arrival_time]
                i += 1
            if not engine.has_unfinished_requests:
                clock.wait_until(queue[i].arrival_time)  # idle: jump to the next arrival
                continue
            for out in engine.step():
                times[out.request_id] += [clock.now()] * len(out.new_token_ids)
        ttft = [t[1] - t[0] for t in times.values()]
        gaps = [later - earlier for t in times.values() for earlier, later in zip(t[1:], t[2:])]
        rows.append({"budget": budget,
                     "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)),
                     "ttft_p99_ms": 1e3 * float(np.percentile(ttft, 99)),
                     "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)),
                     "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99))})
    return rows
