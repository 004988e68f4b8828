"""Notebook 02 (continuous batching): the turnstile scheduler, and how full its batch stays."""
from course_lib.scheduler.base import SchedulerBase
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput


class StudentScheduler(SchedulerBase):
    """Iteration-level scheduling. Every step, running requests advance first (one decode token,
    or the next chunk of a long prompt), preempting the youngest when pages run out; then waiting
    requests take the seats and token budget left. A finished request leaves at once."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens

        # 1. Running requests keep their seats.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = self._chunk(request.num_pending_tokens, budget)
            if n == 0:
                break
            if not self._make_room(request, n, out):
                break  # it was the youngest and gave its own pages back
            self.kv.allocate(request, n)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
            i += 1

        # 2. Fill free seats from the queue (not in a step that had to preempt: the pool is full).
        while self.waiting and not out.preempted and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0:
                break
            if not self.kv.can_allocate(request, n, cached):
                break
            if not self.admission.can_admit(request, n, cached, self.kv, self.running):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
        return out

    def _chunk(self, pending, budget):
        """Tokens to compute now: as many as the budget allows; with chunking off, all or none (a
        prompt longer than the whole budget runs alone in a step, or it would wait forever)."""
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
        """Retire a request that produced its last token: free its seat and its KV pages."""
        self.running.remove(request)
        self.kv.free(request)
        return [request]


def mean_batch_occupancy(step_stats, max_num_seqs):
    """Mean fraction of the batch's seats (max_num_seqs) held by running requests, each step
    weighted by its duration (end_time - start_time); equal weights if no step has a duration.
    0.0 for no steps."""
    if not step_stats:
        return 0.0
    weights = [max(0.0, s.end_time - s.start_time) for s in step_stats]
    if sum(weights) == 0:
        weights = [1.0] * len(step_stats)
    held = sum(w * s.num_running for w, s in zip(weights, step_stats))
    return held / (max_num_seqs * sum(weights))
