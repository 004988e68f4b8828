"""How one request wants its tokens chosen."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

LOGIT_BIAS_LIMIT = 100.0  # as OpenAI: a bias is in [-100, 100]
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs and vLLM's default max_logprobs
_ADJUSTING = frozenset({"presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias"})


@dataclass
class SamplingParams:
    """temperature 0 means greedy. top_k 0 (or -1) and top_p 1.0 switch those filters off.
    A `seed` makes the request's samples reproducible whatever else is in the batch.

    Logit adjustments, as vLLM defines them (logit_adjust.py applies them, before temperature):
    `presence_penalty` / `frequency_penalty` (in [-2, 2]) subtract from the logit of every token
    already generated (once, or once per occurrence); `repetition_penalty` (> 0) divides the
    positive logits and multiplies the negative ones of every token in the prompt or the output;
    `min_tokens` forbids EOS and the stop ids until that many tokens were generated; `logit_bias`
    ({token id: bias in [-100, 100]}) adds to those logits. Their neutral values (0, 0, 1, 0, None)
    leave the logits untouched. `skip_special_tokens` is for detokenizing (the server's text).

Parallel sampling (vLLM's meaning): `n` answers to one prompt, whose prompt K/V is computed once
and shared (the samples fork after the prompt, see engine.py); `best_of` (>= n, None: n) samples
generated, of which the `n` with the highest cumulative log-probability are returned. With a
`seed`, sample i draws from its own generator seeded `seed + i` (vLLM V1's rule), so sample 0 is
the answer n=1 gives and each sample is reproducible on its own. `logprobs` (None: off; k in
[0, 20]) returns, for every generated token, its log-probability and the k most likely tokens'
(the model's raw distribution: before penalties, temperature, top-k / top-p, as vLLM's default
`logprobs_mode`)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = None

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= 1, or 0 / -1 to disable, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.stop_token_ids = list(self.stop_token_ids or [])
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {value!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens = {self.max_tokens}], "
                             f"got {self.min_tokens!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict {{token id: bias}}, got {type(self.logit_bias).__name__}")
            for token, bias in self.logit_bias.items():
                if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
                if not _finite(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                    raise ValueError(f"logit_bias of token {token} must be in [-100, 100], got {bias!r}")
            self.logit_bias = {token: float(bias) for token, bias in self.logit_bias.items()} or None
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1 (samples per prompt), got {self.n!r}")
        if self.best_of is not None and (isinstance(self.best_of, bool) or not isinstance(self.best_of, int)
                                         or self.best_of < self.n):
            raise ValueError(f"best_of must be an integer >= n = {self.n} (or None), got {self.best_of!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        object.__setattr__(self, "adjusts_logits", self._asks_for_adjustment())
        object.__setattr__(self, "needs_logprobs", self._needs_logprobs())

    @property
    def num_samples(self) -> int:
        """Sequences generated for the prompt: best_of if set, else n."""
        return self.best_of or self.n

    # `needs_logprobs`: the runner must report each sampled token's log-probability (asked for, or best_of
    # ranks the samples by it). A plain attribute like `adjusts_logits`, read for every sampled token.
    def _needs_logprobs(self) -> bool:
        return self.logprobs is not None or self.num_samples > self.n

    def check_vocab(self, vocab_size: int) -> None:
        """The engine's check, once it knows the vocabulary: every biased token must exist."""
        bad = [t for t in self.logit_bias or () if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")

    # `adjusts_logits`: whether any logit adjustment is asked for (when none is, the sampler skips
    # them all). A plain attribute, read for every sampled token, kept true by __setattr__ when one
    # of the fields it depends on changes after construction.
    def _asks_for_adjustment(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
                or self.min_tokens > 0 or bool(self.logit_bias))

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name in _ADJUSTING and "adjusts_logits" in self.__dict__:
            object.__setattr__(self, "adjusts_logits", self._asks_for_adjustment())
        if name in ("logprobs", "n", "best_of") and "needs_logprobs" in self.__dict__:
            object.__setattr__(self, "needs_logprobs", self._needs_logprobs())

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _finite(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
