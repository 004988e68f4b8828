"""Iteration-level (continuous) batching: the turnstile.

Every step: the running requests advance first (a decode, or the next chunk of a long
prompt), making room by preempting the youngest when pages run out; then waiting requests
are admitted into the slots and token budget left over. One forward pass serves the mix.
"""
from __future__ import annotations

from .base import SchedulerBase
from .output import ScheduledRequest, SchedulerOutput
from .request import Request


class ContinuousScheduler(SchedulerBase):
    name = "continuous"

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens

        # 1. Requests already running keep their seats.
        running, scheduled, try_append_slot = self.running, out.scheduled, self.kv.try_append_slot
        drafts = self._propose_drafts() if self.drafter is not None else None  # speculative decoding: guesses
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            # The common case first, written for speed (it runs for every running request every step):
            # a decode whose next slot is already in its last page. Its entry is complete at once.
            computed = request.num_computed_tokens
            output = request.output_token_ids
            if len(request.prompt_token_ids) + len(output) == computed + 1:
                if drafts and request.request_id in drafts:  # a decode with guesses: 1 + k tokens
                    # Guesses take only the budget left after one token for each running request behind
                    # this one: drafts never push a plain decode out of the step.
                    entry = self._drafted_entry(request, drafts[request.request_id], budget - (len(running) - i - 1))
                    if entry is not None:
                        scheduled.append(entry)
                        budget -= entry.num_new_tokens
                        i += 1
                        continue
                pages = try_append_slot(request)
                if pages is not None:
                    scheduled.append(ScheduledRequest(
                        request.request_id, 1, computed, True, [output[-1] if output else request.prompt_token_ids[-1]],
                        pages, request.sampling_params))
                    budget -= 1
                    i += 1
                    continue
            n = self._chunk(request.num_pending_tokens, budget)
            if n == 0:
                break  # an unchunked prompt waits for a step with room for all of it
            if not self._make_room(request, n, out):
                break  # it was the youngest and gave up its own pages
            self.kv.allocate(request, n)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
            i += 1

        # 2. Admit from the queue, but never in a step that had to preempt: the pool is full.
        # A group's sample 0 takes seats for its siblings too (they join when its prompt is done).
        while self.waiting and not out.preempted and self._seats_free() > len(self.waiting[0].forks) and budget > 0:
            request = self.waiting[0]
            cached = self.kv.lookup_prefix(request)
            n = self._chunk(request.num_tokens - len(cached) * self.kv.page_size, budget)
            if n == 0:
                break
            if not self.kv.can_allocate(request, n, cached):
                break
            # An empty engine always admits (the request was checked to fit the pool when added),
            # otherwise a policy stricter than the pool could keep a lone request waiting forever.
            if self.running and not self.admission.can_admit(request, n, cached, self.kv, self.running):
                break
            self.waiting.popleft()
            self._admit(request, n, cached)
            out.scheduled.append(self._entry(request, n))
            budget = max(0, budget - n)
        return out

    def _chunk(self, pending: int, budget: int) -> int:
        """Tokens to compute now: as many as the budget allows, or with chunking off all or none.
        An unchunked prompt bigger than the whole budget may run alone in a step of its own,
        otherwise it (or a request recomputing after preemption) would wait forever."""
        if self.enable_chunked_prefill:
            return min(pending, budget)
        if pending <= budget or budget == self.max_num_batched_tokens:
            return pending
        return 0

    @staticmethod
    def _entry(request: Request, n: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        return ScheduledRequest(request.request_id, n, start, start + n == request.num_tokens)

    def finish(self, request: Request) -> list[Request]:
        self.running.remove(request)
        self.kv.free(request)
        return [request]
