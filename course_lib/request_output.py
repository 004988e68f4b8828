"""RequestOutput: what the engine hands back for one request after a step (its tokens so far, how it
finished, its timestamps and counts). `course_lib.engine` re-exports it, its public home."""
from __future__ import annotations

from .scheduler.request import Request, RequestStatus


class RequestOutput:
    """A snapshot of one request: its tokens so far, how it finished, and its timestamps.

    Built for every request that changed in a step, so it must be cheap: it keeps the
    request's own (append-only) output list and the length at snapshot time, and copies
    only when `token_ids` is read."""

    __slots__ = ("request_id", "prompt_token_ids", "_tokens", "_num_tokens", "finished", "finish_reason",
                 "error", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time",
                 "num_preemptions", "num_cached_tokens", "new_token_ids", "parent_id", "index", "_logprobs",
                 "cumulative_logprob", "samples")

    def __init__(self, request_id, prompt_token_ids, token_ids, finished, finish_reason, error=None,
                 arrival_time=0.0, first_scheduled_time=None, first_token_time=None, finish_time=None,
                 num_preemptions=0, num_cached_tokens=0, new_token_ids=(), parent_id=None, index=0,
                 logprobs=None, cumulative_logprob=0.0, samples=None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids  # shared with the request, never mutated
        self._tokens, self._num_tokens = token_ids, len(token_ids)
        self.finished, self.finish_reason, self.error = finished, finish_reason, error
        self.arrival_time, self.first_scheduled_time = arrival_time, first_scheduled_time
        self.first_token_time, self.finish_time = first_token_time, finish_time
        self.num_preemptions, self.num_cached_tokens = num_preemptions, num_cached_tokens
        self.new_token_ids = new_token_ids if type(new_token_ids) is list else list(new_token_ids)  # (streaming)
        # Parallel sampling: the group's id (add_request's) and this sample's index in it (None, 0 alone);
        # a group's output from generate() lists its answers in `samples`.
        self.parent_id, self.index, self.samples = parent_id, index, samples
        self._logprobs, self.cumulative_logprob = logprobs, cumulative_logprob

    @property
    def logprobs(self) -> list | None:
        """With SamplingParams.logprobs: per generated token (its logprob, ((id, logprob), ...) of the
        top alternatives), at snapshot time; else None."""
        return None if self._logprobs is None else self._logprobs[: self._num_tokens]

    @property
    def token_ids(self) -> list[int]:
        """The generated ids at snapshot time (a fresh list each read)."""
        return self._tokens[: self._num_tokens]

    @property
    def new_logprobs(self) -> list | None:
        """The logprobs entries of `new_token_ids` (None without SamplingParams.logprobs)."""
        if self._logprobs is None:
            return None
        return self._logprobs[self._num_tokens - len(self.new_token_ids): self._num_tokens]

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, token_ids={self.token_ids}, "
                f"finished={self.finished}, finish_reason={self.finish_reason!r})")

    @classmethod
    def of(cls, r: Request, new_token_ids=()) -> "RequestOutput":
        # Positional, not keywords: the engine builds one per changed request per step.
        finished = r.status is RequestStatus.FINISHED
        return cls(
            r.request_id, r.prompt_token_ids, r.output_token_ids, finished,
            r.finish_reason.value if finished and r.finish_reason else None, r.error,
            r.arrival_time, r.first_scheduled_time, r.first_token_time, r.finish_time,
            r.num_preemptions, r.num_cached_tokens, new_token_ids, r.parent_id, r.sample_index, r.logprobs,
            r.cumulative_logprob,
        )
