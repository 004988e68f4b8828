"""A request and its one progress counter.

Prefill, chunked prefill, decode, prefix-cache hits and recompute after preemption are all
the same motion: `num_computed_tokens` moving toward `num_tokens` (prompt + output so far).
When a step computes up to the last known token, the model's logits there give the next
token, which makes the request one token longer.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .sampling import SamplingParams


def sample_id(group_id: str, index: int) -> str:
    """The request id of sample `index` of a request with n / best_of > 1 (SamplingParams)."""
    return f"{group_id}#{index}"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # gave its pages back; waits to be recomputed
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"  # max_tokens reached, or max_model_len
    STOP = "stop"  # one of the request's stop_token_ids
    ABORTED = "aborted"
    ERROR = "error"  # e.g. out of KV pages with preemption switched off


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    # Bookkeeping the metrics read.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    # Behind the `num_cached_tokens` property below, which keeps it within the prompt.
    _num_cached_tokens: int = field(default=0, repr=False)
    admit_seq: int = -1  # order of (latest) admission: the youngest is preempted first
    # Parallel sampling (SamplingParams.n / best_of > 1): each sample is a Request of its own, with id
    # "<parent_id>#<sample_index>". Only sample 0 is queued; the others wait in its `forks` and are born
    # when its prompt is computed, sharing its pages (SchedulerBase._fork).
    parent_id: str | None = None
    sample_index: int = 0
    forks: list | tuple = ()
    # With SamplingParams.logprobs (or best_of): per output token (its logprob, ((id, logprob), ...) of the
    # top alternatives), and the sum of the sampled tokens' logprobs.
    logprobs: list | None = None
    cumulative_logprob: float = 0.0

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache at the request's (latest) admission: at
        most its prompt length."""
        return self._num_cached_tokens

    @num_cached_tokens.setter
    def num_cached_tokens(self, num_tokens_in_cached_pages: int) -> None:
        # The scheduler's `_admit` sets it to the tokens the request's cached pages hold, which is
        # also how far its progress jumps. After a preemption the request is re-admitted over its
        # prompt *and* the tokens it already generated, and the pages it filled with those may
        # still be cached: the hit then reaches past the prompt (40 cached tokens for a 14-token
        # prompt), and the metrics' cached-token fraction would exceed 1. Cached pages always
        # cover a leading run of prompt + output, so the prompt's share of them is this minimum.
        # (The KV manager's `hit_tokens` counts the same share.)
        self._num_cached_tokens = min(num_tokens_in_cached_pages, self.num_prompt_tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def num_pending_tokens(self) -> int:
        """Known tokens whose K/V are not computed yet (1 for a request in decode)."""
        return self.num_tokens - self.num_computed_tokens

    def max_kv_slots(self, max_model_len: int) -> int:
        """The most K/V slots this request can ever fill: what a worst-case reservation must cover.
        The final sampled token ends the request before its K/V is ever computed, hence the -1."""
        return min(self.num_prompt_tokens + self.sampling_params.max_tokens, max_model_len) - 1
