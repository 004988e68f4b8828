"""Static batching: the school bus.

The bus leaves only when it is empty: it takes up to `max_num_seqs` waiting requests, pads
every prompt to the longest, and decodes them together. A request that finishes early keeps
its seat as a padding row until the slowest passenger is done, and answers are delivered
when the bus arrives. With contiguous KV its buffer stays reserved for the whole ride; with
paged KV its pages come back at once (paging fixes the space waste, not the time waste).
It exists to be measured against.
"""
from __future__ import annotations

from .base import SchedulerBase
from .output import ScheduledRequest, SchedulerOutput
from .request import Request


class StaticScheduler(SchedulerBase):
    name = "static"

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        riding = [r for r in self.running if r.finish_reason is None]
        if not riding:
            self._board(out)
            return out
        # Everyone still riding decodes one token (or recomputes after a preemption).
        for request in riding:
            if request not in self.running:
                continue  # preempted earlier in this step
            n = request.num_pending_tokens
            if not self._make_room(request, n, out):
                continue
            self.kv.allocate(request, n)
            out.scheduled.append(ScheduledRequest(request.request_id, n, request.num_computed_tokens, True))
        # Finished passengers still occupy their rows: padding the forward pass computes anyway.
        out.num_padded_tokens = sum(1 for r in self.running if r.finish_reason is not None)
        return out

    def _board(self, out: SchedulerOutput) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            start = len(cached) * self.kv.page_size
            n = request.num_tokens - start  # the whole (uncached) prompt at once: no chunking on the bus
            if not self.kv.can_allocate(request, n, cached):
                break
            if self.running and not self.admission.can_admit(request, n, cached, self.kv, self.running):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(ScheduledRequest(request.request_id, n, start, True))
        if out.scheduled:
            longest = max(s.num_new_tokens for s in out.scheduled)
            out.num_padded_tokens = sum(longest - s.num_new_tokens for s in out.scheduled)

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        finished = super().update(out, sampled)
        if self.running and all(r.finish_reason is not None for r in self.running):
            # The last rider was aborted (abort leaves no step to end the ride): the bus arrives
            # with the passengers who had finished before it.
            self._deliver(self._arrive(), finished)
        return finished

    def finish(self, request: Request) -> list[Request]:
        if not self.kv.reserve_max_len:
            self.kv.free(request)  # paged memory comes back at once; the seat does not
        if any(r.finish_reason is None for r in self.running):
            return []  # the bus is still on the road
        return self._arrive()

    def _arrive(self) -> list[Request]:
        """Everyone on the bus gets off: their memory and their seats come back."""
        arrived = list(self.running)
        for r in arrived:
            self.kv.free(r)
        self.running.clear()
        return arrived
