"""What the scheduler decides each step, and what the engine records about it.

`SchedulerOutput` is the whole contract between the scheduler and the runner (vLLM V1 style):
a plain data object, printable and comparable, that says which requests run this step and,
for each, everything the forward pass needs: the new tokens' ids and positions, the request's
page ids (its block table, from which the KV slots follow) and whether (and how) a token is
sampled. Nothing flows back except the sampled tokens.

A scheduler's `schedule()` only decides *who* runs and *how many* tokens each computes: it
appends `ScheduledRequest(request_id, num_new_tokens, start, samples)` entries. The scheduler
base then fills in the rest (`SchedulerBase.next_step`), from the request and its page table.
The runner turns it into tensors (runner_batch.py).

`StepStats` is the engine's record of one step: the clock prices it (roofline or wall) and the
metrics / plots read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..kv.slots import slot_mapping
from .sampling import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int  # tokens to compute this step (1 for a decode, a chunk for prefill)
    start: int  # num_computed_tokens before this step: the first new token's position
    samples: bool  # True when this chunk reaches the end of the known tokens: a token is sampled
    # What the runner reads, filled in by the scheduler base after schedule() (None until then).
    token_ids: list[int] | None = None  # the new tokens, at positions start .. start + num_new_tokens - 1
    page_ids: tuple[int, ...] | None = None  # every page of the request, in order (its block table)
    sampling_params: SamplingParams | None = None  # how to sample its next token (when `samples`)
    # (prompt ids, output ids): the request's own lists, not copies, set only when its sampling params
    # adjust logits (penalties, min_tokens, logit_bias read what it has seen); kept out of repr and ==.
    history: tuple | None = field(default=None, repr=False, compare=False)
    # Parallel sampling: (request id, sampling params) of each sample born from this row (its request's
    # siblings). The runner draws a token for each from the same logits, with the sample's own
    # generator (its params carry its seed). Empty almost always.
    forks: tuple = field(default=(), repr=False, compare=False)
    # Speculative decoding: the drafter's guesses, the row's last num_new_tokens - 1 token_ids. The runner
    # returns the target's token at each of its 1 + k positions (a list, spec/verify.py), the scheduler
    # keeps the agreeing prefix. `draft_probs`: the drafter's distributions [k, vocab] for a sampled
    # request (the rejection rule divides by them), None for certain guesses (n-gram) or greedy.
    draft_token_ids: tuple = ()
    draft_probs: object = field(default=None, repr=False, compare=False)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_new_tokens)

    def slots(self, page_size: int) -> list[int]:
        """Where the new tokens' K/V go (the slot mapping): position p sits in page
        page_ids[p // page_size] at offset p % page_size (`kv.slots.slot_mapping`, the one formula)."""
        return slot_mapping(self.page_ids, page_size, self.start, self.num_new_tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # ids that gave their pages back this step
    failed: list[str] = field(default_factory=list)  # ids that could not continue (preemption off)
    finished_ids: list[str] = field(default_factory=list)  # ids gone since the last step: runners drop their state
    num_padded_tokens: int = 0  # static batching computes padding rows too; the clock charges them
    num_running: int = 0  # requests holding a seat after this decision (static: finished passengers too)
    num_waiting: int = 0  # requests in the queue after this decision
    # Copy on write: (source page, fresh page) pairs whose K/V the runner copies before the forward
    # pass: a sample about to write into a page it shares with its siblings gets a copy of its own.
    page_copies: list[tuple[int, int]] = field(default_factory=list)
    # Speculative decoding, written by `update`: tokens each drafted request added this step (its kept
    # drafts plus the target's own, cut at a stop), and the drafts kept in all.
    num_appended: dict[str, int] = field(default_factory=dict)
    num_accepted_drafts: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class SampledTokens(dict):
    """What a runner returns: {request id: token}, and in `logprobs` {request id: (logprob of the token,
    ((token id, logprob), ...) of the top alternatives)} for the rows whose sampling parameters ask for
    them (`SamplingParams.needs_logprobs`). A plain dict (no logprobs) is as good when none ask."""

    __slots__ = ("logprobs",)

    def __init__(self, tokens=(), logprobs=None):
        super().__init__(tokens)
        self.logprobs = logprobs or {}


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
    num_draft_tokens: int = 0  # speculative decoding: draft tokens computed this step (in num_decode_tokens)
    num_accepted_tokens: int = 0  # ... and how many of them the target kept
    # A draft model's own work this step (zero for n-gram lookup, which computes nothing): rows it computed,
    # keys those rows attended to, its passes one after another, and its share of the target's layers.
    draft_model_rows: int = 0
    draft_model_context_tokens: int = 0
    draft_model_passes: int = 0
    draft_layer_fraction: float = 0.0

    @property
    def kv_waste_slots(self) -> int:
        return self.kv_allocated_slots - self.kv_used_slots
