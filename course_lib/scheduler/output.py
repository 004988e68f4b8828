"""What the scheduler decides each step, and what the engine records about it.

`SchedulerOutput` is a plain data object (vLLM V1 style): the runner consumes it, nothing
flows back except sampled tokens. `StepStats` is the engine's record of one step: the clock
prices it (roofline or wall) and the metrics / plots read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int  # tokens to compute this step (1 for a decode, a chunk for prefill)
    start: int  # num_computed_tokens before this step: the first new token's position
    samples: bool  # True when this chunk reaches the end of the known tokens: a token is sampled


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    failed: list = field(default_factory=list)  # requests that could not continue (preemption off)
    num_padded_tokens: int = 0  # static batching computes padding rows too; the clock charges them

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class StepStats:
    """One engine step, as the clock and the metrics see it."""

    step: int
    start_time: float
    end_time: float
    num_running: int  # requests holding a batch slot (static: including finished ones waiting for the bus)
    num_waiting: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padded_tokens: int
    context_tokens_read: int  # K/V tokens read: each scheduled sequence reads its context once
    attention_context_tokens: int  # sum over query tokens of the context each attends to (attention FLOPs)
    kv_tokens_written: int
    kv_used_slots: int  # slots holding a real token's K/V
    kv_allocated_slots: int  # slots reserved for running requests (pages x page size, or max_model_len each)
    kv_total_slots: int
    num_preemptions: int  # preemptions during this step
    page_owners: list | None = None  # optional: owner request id (or None) of every physical page

    @property
    def kv_waste_slots(self) -> int:
        return self.kv_allocated_slots - self.kv_used_slots
