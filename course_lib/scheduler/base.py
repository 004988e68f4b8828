"""What both schedulers share: two queues, preemption by recompute, and retiring requests."""
from __future__ import annotations

from collections import deque

from .output import SchedulerOutput
from .request import FinishReason, Request, RequestStatus


class SchedulerBase:
    def __init__(self, kv, admission, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, preemption: str = "recompute"):
        if preemption not in ("recompute", "fail"):
            raise ValueError(f"preemption must be 'recompute' or 'fail', got {preemption!r}")
        self.kv = kv
        self.admission = admission
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption = preemption
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the youngest is last
        self.num_preemptions = 0
        self._admit_counter = 0

    # -- questions --------------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- actions ----------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def _admit(self, request: Request, num_new_tokens: int, cached_pages) -> None:
        self.kv.allocate(request, num_new_tokens, cached_pages)
        request.status = RequestStatus.RUNNING
        request.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running.append(request)

    def _preempt_youngest(self, out: SchedulerOutput) -> Request:
        """Out of pages: the most recently admitted request gives its pages back and goes to the
        front of the queue, to be recomputed from its prompt and the tokens it already produced."""
        # The youngest request still generating (a static bus's finished passengers hold no pages).
        index = max(i for i, r in enumerate(self.running) if r.finish_reason is None)
        victim = self.running.pop(index)
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(victim.request_id)
        if self.preemption == "fail":
            victim.status = RequestStatus.FINISHED
            victim.finish_reason = FinishReason.ERROR
            victim.error = (f"out of KV pages mid-generation ({self.kv.num_pages} pages in the pool) "
                            "and preemption is off")
            out.failed.append(victim)
        else:
            victim.status = RequestStatus.PREEMPTED
            self.waiting.appendleft(victim)
        return victim

    def _make_room(self, request: Request, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt younger requests until `request` can grow by `num_new_tokens`.
        False if `request` itself had to go."""
        while not self.kv.can_allocate(request, num_new_tokens):
            if self._preempt_youngest(out) is request:
                return False
        return True

    def finish(self, request: Request) -> list[Request]:
        """`request` has produced its last token. Returns the requests whose answers are now
        delivered (the continuous scheduler delivers at once; the static one when the bus arrives)."""
        raise NotImplementedError

    def abort(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.kv.free(request)
