"""Who gives its pages back: victim policies for preemption, compared side by side (notebook 7).

`SchedulerBase._make_room` asks `choose_victim()` for a running request to preempt, and refuses
one that already runs in this step (its entry is built, its pages are in use). Which requests
those are is known only inside the step, so `PreemptionScheduler` (course_lib's continuous
scheduler, unchanged otherwise) tells `choose_victim` two things while it is being asked:

- `self.preemptible`: the running requests still generating that this step has not scheduled yet,
  in admission order (the oldest first); the request asking for room is one of them (the last to
  be considered if it is the youngest), and naming it means it gives up its own place;
- `self.asking`: the request that needs room (None outside a step).

The policies below are `choose_victim` written three ways, for the measurement cell of notebook 7
(youngest first is what SchedulerBase, nano-vllm and vLLM's V1 scheduler do). This is a file of
its own so that the scheduler files stay as they are.
"""
from __future__ import annotations

from .continuous import ContinuousScheduler
from .request import Request


class PreemptionScheduler(ContinuousScheduler):
    """ContinuousScheduler that tells `choose_victim` who may be preempted now (`self.preemptible`)."""

    asking: Request | None = None
    _scheduled_now: frozenset = frozenset()

    @property
    def preemptible(self) -> list[Request]:
        """Running requests still generating and not yet scheduled in this step, oldest first."""
        return [r for r in self.running if r.finish_reason is None and r.request_id not in self._scheduled_now]

    def _make_room(self, request, num_new_tokens, out) -> bool:
        self.asking, self._scheduled_now = request, frozenset(s.request_id for s in out.scheduled)
        try:
            return super()._make_room(request, num_new_tokens, out)
        finally:
            self.asking, self._scheduled_now = None, frozenset()


class YoungestFirst(PreemptionScheduler):
    """The most recently admitted request goes: it has done the least work (vLLM V1, nano-vllm)."""

    def choose_victim(self) -> Request:
        return self.preemptible[-1]


class OldestFirst(PreemptionScheduler):
    """The oldest request that may still go in this step. The older ones already hold their place in
    the step, so this is the request asking for room: it steps aside for everyone behind it."""

    def choose_victim(self) -> Request:
        return self.preemptible[0]


class MostPagesFirst(PreemptionScheduler):
    """The request holding the most pages goes (ties: the youngest): one preemption frees the most room."""

    def choose_victim(self) -> Request:
        tables = self.kv.tables
        return max(reversed(self.preemptible), key=lambda r: len(tables[r.request_id].pages) if r.request_id in tables
                   else 0)


POLICIES = {"youngest first": YoungestFirst, "oldest first": OldestFirst, "most pages first": MostPagesFirst}
