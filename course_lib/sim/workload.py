"""Workloads: who asks for what, and when.

Everything here is seeded and deterministic: the same seed gives the same requests, byte for
byte, so a simulation can be replayed and two engine configurations compared on identical
traffic. Each generator draws arrivals, prompt lengths and output lengths from *separate*
random streams (spawned from one seed), so changing the arrival rate of a load sweep leaves the
request lengths untouched: every point of the sweep serves the same requests, only faster.

Two kinds of load:

- **open loop** (`open_loop`): requests arrive on their own schedule (Poisson, or gamma gaps
  for burstier / smoother traffic) whether or not the server keeps up; queues can grow
  without bound. This is how a public API sees the world.
- **closed loop** (`ClosedLoopUsers`): N users each wait for their answer, think, then ask
  again; at most N requests are ever outstanding. This is how a chat app with N active
  users sees the world, and what `simulate --users N` runs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# z-score of the 99th percentile of a standard normal: p99 of a log-normal = median * exp(Z99 * sigma)
_Z99 = 2.3263478740408408


@dataclass
class RequestSpec:
    """One request of a workload, before any engine sees it.

    `prompt_len` includes the shared prefix (the first `shared_prefix_len` prompt tokens are
    the same for every request of the workload). `arrival_time` is None for "whenever the
    driver likes" (e.g. an offline batch); `user` is the closed-loop user that sent it.
    """

    request_id: str
    prompt_len: int
    output_len: int
    arrival_time: float | None
    user: int | None
    shared_prefix_len: int = 0


# ---------------------------------------------------------------------------------------------
# Length distributions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts: `fixed`, `uniform` or `lognormal` (heavy-tailed).

    Build one with the class methods; `sample(rng, n)` returns `n` ints in `[lo, hi]`.
    """

    kind: str  # "fixed" | "uniform" | "lognormal"
    lo: int
    hi: int
    median: float = 0.0  # lognormal only: exp(mu)
    sigma: float = 0.0  # lognormal only: standard deviation of log(length)

    def __post_init__(self):
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"unknown length distribution kind {self.kind!r}; use fixed, uniform or lognormal")
        if self.lo < 1 or self.hi < self.lo:
            raise ValueError(f"length bounds must satisfy 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")
        if self.kind == "lognormal" and (self.median <= 0 or self.sigma < 0):
            raise ValueError(f"lognormal needs median > 0 and sigma >= 0, got median={self.median}, sigma={self.sigma}")

    @classmethod
    def fixed(cls, n: int) -> "LengthDist":
        return cls("fixed", int(n), int(n))

    @classmethod
    def uniform(cls, lo: int, hi: int) -> "LengthDist":
        """Integers drawn uniformly from `lo..hi`, both ends included."""
        return cls("uniform", int(lo), int(hi))

    @classmethod
    def lognormal(cls, median: float, sigma: float, lo: int, hi: int) -> "LengthDist":
        """round(exp(N(log(median), sigma))), clipped to `[lo, hi]`."""
        return cls("lognormal", int(lo), int(hi), float(median), float(sigma))

    @classmethod
    def heavy_tailed(cls, median: float, p99: float, lo: int, hi: int) -> "LengthDist":
        """A log-normal given by its median and (unclipped) 99th percentile, clipped to `[lo, hi]`."""
        if p99 < median:
            raise ValueError(f"p99 ({p99}) must be >= median ({median})")
        return cls.lognormal(median, math.log(p99 / median) / _Z99, lo, hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.lo, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.lo, self.hi, size=n, endpoint=True).astype(np.int64)
        raw = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=n)
        return np.clip(np.rint(raw), self.lo, self.hi).astype(np.int64)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed({self.lo})"
        if self.kind == "uniform":
            return f"uniform({self.lo}..{self.hi})"
        return f"lognormal(median={self.median:g}, sigma={self.sigma:.3f}, clip={self.lo}..{self.hi})"


# Chat-like defaults. Most chat turns are short, a few are very long, so both are log-normal.
# Prompts: median 64 tokens, p99 400 -> sigma = ln(400/64)/2.326 = 0.788; mean ~ 87 tokens.
#   Clipped to [4, 1024]: a prompt needs at least a few tokens, and 1024 keeps one prompt well
#   inside the tiny model's context and any course-sized KV pool.
# Outputs: median 128 tokens, sigma 1.0 -> p90 ~ 460, mean ~ 200 (the chapter's "average response
#   is 200 tokens"); clipped to [1, 1024] (about 2% hit the cap). The wider sigma (a longer tail
#   than prompts) is what makes static batching hurt: one long answer holds the whole bus while
#   the short ones sit finished.
DEFAULT_PROMPT_DIST = LengthDist.heavy_tailed(median=64, p99=400, lo=4, hi=1024)
DEFAULT_OUTPUT_DIST = LengthDist.lognormal(median=128, sigma=1.0, lo=1, hi=1024)


def _streams(seed: int, n: int) -> list[np.random.Generator]:
    """`n` independent generators from one seed (one per quantity, so they never shift each other)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


# ---------------------------------------------------------------------------------------------
# Open loop
# ---------------------------------------------------------------------------------------------


def arrival_gaps(rng: np.random.Generator, n: int, rate: float, burstiness: float = 1.0) -> np.ndarray:
    """`n` gaps between arrivals with mean `1/rate` seconds.

    Gamma-distributed with shape `burstiness` (vLLM's `--burstiness` convention): shape 1 is an
    exponential gap, i.e. a Poisson process; shape < 1 is burstier (clumps and lulls), shape > 1
    smoother. The coefficient of variation of a gap is 1/sqrt(burstiness). `rate=inf` means
    everything arrives at once (all gaps 0).
    """
    if not rate > 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness (gamma shape) must be > 0, got {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def open_loop(
    n: int,
    rate: float,
    prompt_dist: LengthDist = DEFAULT_PROMPT_DIST,
    output_dist: LengthDist = DEFAULT_OUTPUT_DIST,
    seed: int = 0,
    burstiness: float = 1.0,
    shared_prefix: int = 0,
) -> list[RequestSpec]:
    """`n` requests arriving at `rate` per second (Poisson when `burstiness == 1`).

    The first request arrives after one gap (a process started at t=0). With `shared_prefix=T`,
    every prompt is T shared tokens followed by its own `prompt_dist` tokens, so
    `prompt_len = T + sample`.
    """
    if n < 0:
        raise ValueError(f"number of requests must be >= 0, got {n}")
    if shared_prefix < 0:
        raise ValueError(f"shared_prefix must be >= 0 tokens, got {shared_prefix}")
    arrival_rng, prompt_rng, output_rng = _streams(seed, 3)
    arrivals = np.cumsum(arrival_gaps(arrival_rng, n, rate, burstiness))
    prompts = prompt_dist.sample(prompt_rng, n) + shared_prefix
    outputs = output_dist.sample(output_rng, n)
    return [
        RequestSpec(f"r{i}", int(prompts[i]), int(outputs[i]), float(arrivals[i]), None, shared_prefix)
        for i in range(n)
    ]


# ---------------------------------------------------------------------------------------------
# Closed loop
# ---------------------------------------------------------------------------------------------


class ClosedLoopUsers:
    """N users who each ask, wait for the answer, think, and ask again, until
    `num_requests` have been issued in total.

    The simulator drives it:

        specs = users.initial()                 # one request per user
        ... when a request ends (finished, aborted or failed alike):
        nxt = users.on_finish(spec, finish_time)  # that user's next request, or None

    The k-th request issued is "r{k}" and its lengths are the k-th draws of fixed streams, so
    the workload depends only on the seed and the order in which requests finish. Think time
    is exponential with mean `think_time` seconds (exactly 0 when `think_time == 0`). User u's
    first request arrives at `u * stagger` (all at t=0 by default).
    """

    def __init__(
        self,
        num_users: int,
        num_requests: int,
        prompt_dist: LengthDist = DEFAULT_PROMPT_DIST,
        output_dist: LengthDist = DEFAULT_OUTPUT_DIST,
        seed: int = 0,
        think_time: float = 0.0,
        shared_prefix: int = 0,
        stagger: float = 0.0,
    ):
        if num_users < 1:
            raise ValueError(f"num_users must be >= 1, got {num_users}")
        if num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {num_requests}")
        if think_time < 0 or stagger < 0:
            raise ValueError(f"think_time and stagger must be >= 0 s, got {think_time}, {stagger}")
        if shared_prefix < 0:
            raise ValueError(f"shared_prefix must be >= 0 tokens, got {shared_prefix}")
        self.num_users = num_users
        self.num_requests = num_requests
        self.think_time = think_time
        self.shared_prefix = shared_prefix
        self.stagger = stagger
        think_rng, prompt_rng, output_rng = _streams(seed, 3)
        # Drawn up front, indexed by issue order: request k always gets the same lengths.
        self._prompt_lens = prompt_dist.sample(prompt_rng, num_requests) + shared_prefix
        self._output_lens = output_dist.sample(output_rng, num_requests)
        self._think = think_rng.exponential(think_time, num_requests) if think_time > 0 else np.zeros(num_requests)
        self._issued = 0
        self._outstanding: dict[str, int] = {}  # request_id -> user

    @property
    def num_issued(self) -> int:
        return self._issued

    @property
    def num_outstanding(self) -> int:
        return len(self._outstanding)

    @property
    def done(self) -> bool:
        """True once every request has been issued and has come back."""
        return self._issued == self.num_requests and not self._outstanding

    def _issue(self, user: int, arrival_time: float) -> RequestSpec:
        k = self._issued
        self._issued += 1
        spec = RequestSpec(
            f"r{k}", int(self._prompt_lens[k]), int(self._output_lens[k]), float(arrival_time), user, self.shared_prefix
        )
        self._outstanding[spec.request_id] = user
        return spec

    def initial(self) -> list[RequestSpec]:
        """The first request of each user (fewer if `num_requests < num_users`). Call once."""
        if self._issued:
            raise RuntimeError("ClosedLoopUsers.initial() was already called")
        return [self._issue(u, u * self.stagger) for u in range(min(self.num_users, self.num_requests))]

    def on_finish(self, spec: RequestSpec, finish_time: float) -> RequestSpec | None:
        """Record that `spec` ended at `finish_time`; return its user's next request, or None."""
        user = self._outstanding.pop(spec.request_id, None)
        if user is None:
            raise ValueError(f"request {spec.request_id!r} is not outstanding (finished twice, or not issued here)")
        if self._issued >= self.num_requests:
            return None
        return self._issue(user, finish_time + float(self._think[self._issued]))


# ---------------------------------------------------------------------------------------------
# Traces and prompt tokens
# ---------------------------------------------------------------------------------------------


def save_trace(specs: Iterable[RequestSpec], path: str | Path) -> None:
    """One JSON object per line, in order: replayable with `load_trace`."""
    with open(path, "w") as f:
        for spec in specs:
            f.write(json.dumps(asdict(spec)) + "\n")


def load_trace(path: str | Path) -> list[RequestSpec]:
    specs = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                specs.append(RequestSpec(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a RequestSpec line ({e})") from e
    return specs


def _id_entropy(request_id: str) -> int:
    # Python's hash() of a str changes per process; a digest does not.
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little")


@functools.lru_cache(maxsize=16)
def _allowed_ids(vocab_size: int, reserved_ids: tuple) -> np.ndarray:
    # Cached: setdiff1d costs ~1 ms, which dominated simulating 10,000 requests.
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(reserved_ids, dtype=np.int64))
    allowed.flags.writeable = False
    return allowed


def make_prompt_tokens(
    spec: RequestSpec, vocab_size: int, seed: int = 0, reserved_ids: Sequence[int] = (0, 1, 2)
) -> list[int]:
    """Deterministic token ids for `spec`: the shared prefix is the same for every spec (given
    the seed), the rest depends on the request id. Never emits `reserved_ids` (pad/bos/eos...),
    so a prompt cannot end itself early or confuse the tokenizer.
    """
    allowed = _allowed_ids(int(vocab_size), tuple(int(t) for t in reserved_ids))
    if allowed.size == 0:
        raise ValueError(f"vocab_size {vocab_size} leaves no usable ids after reserving {tuple(reserved_ids)}")
    if not 0 <= spec.shared_prefix_len <= spec.prompt_len:
        raise ValueError(
            f"shared_prefix_len ({spec.shared_prefix_len}) must be within the prompt length ({spec.prompt_len})"
        )
    prefix = _shared_prefix_ids(allowed, seed, spec.shared_prefix_len)
    own_rng = np.random.default_rng([seed, 1, _id_entropy(spec.request_id)])
    rest = allowed[own_rng.integers(0, allowed.size, size=spec.prompt_len - spec.shared_prefix_len)]
    return prefix + rest.tolist()


_prefix_cache: dict = {}


def _shared_prefix_ids(allowed: np.ndarray, seed: int, length: int) -> list[int]:
    # Cached per (alphabet, seed, length): seeding a generator costs ~0.1 ms, and every prompt
    # of a workload asks for the same prefix.
    key = (allowed.tobytes(), seed, length)
    if key not in _prefix_cache:
        if len(_prefix_cache) > 64:
            _prefix_cache.clear()
        prefix_rng = np.random.default_rng([seed, 0])
        _prefix_cache[key] = allowed[prefix_rng.integers(0, allowed.size, size=length)].tolist()
    return list(_prefix_cache[key])
