"""The draft model's own KV cache: per request, the keys and values of its layers for the tokens it has
seen, so that a drafting step computes only what is new (the tokens kept since the last step, then one
row per guess) instead of rerunning the whole sequence once per guess.

Two kinds of rows go through the draft model's layers:

- **kept tokens** (the request's prompt and output, which the target has accepted): their keys and
  values join the request's cache (`CachedAttention(..., keep=True)`);
- **guesses**: their keys and values are held aside (`pending`) for the later guesses of the same step.
  At the next step the guesses the target kept are the request's next tokens: those keys and values
  move into the cache (`catch_up`), and only the target's own token (and a last guess no pass ever fed)
  is computed again.

A cache is trusted only while its tokens are a prefix of the request's: anything else (a request whose
output was rolled back further than the drafts, a reused request id) starts it over. It lives in plain
per-request tensors, not in the engine's page pool: a deployment would page it like the target's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class SequenceCache:
    """One request's cached tokens, and each draft layer's keys and values for them ([tokens, kv heads, dim])."""

    def __init__(self, num_layers: int):
        self.tokens: list[int] = []
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        # This step's guesses: their tokens, and per layer their keys and values.
        self.pending_tokens: list[int] = []
        self.pending_k: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.pending_v: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def __len__(self) -> int:
        return len(self.tokens)

    def catch_up(self, tokens: list[int]) -> list[int]:
        """Make the cache a prefix of `tokens` (the request's kept tokens now), keeping last step's
        guesses that the target kept; return the tokens still to compute (at least the last one, whose
        row gives the first guess's logits)."""
        n = len(self.tokens)
        if tokens[:n] != self.tokens:
            self._truncate(0)
            n = 0
        kept = 0
        for guess, token in zip(self.pending_tokens, tokens[n:]):
            if guess != token:
                break
            kept += 1
        if kept:
            for layer in range(len(self.k)):
                self.k[layer] = _joined(self.k[layer], self.pending_k[layer][:kept])
                self.v[layer] = _joined(self.v[layer], self.pending_v[layer][:kept])
            self.tokens += self.pending_tokens[:kept]
        self.drop_pending()
        if len(self.tokens) >= len(tokens):  # nothing new since the last step: recompute the last token
            self._truncate(len(tokens) - 1)
        return tokens[len(self.tokens):]

    def drop_pending(self) -> None:
        self.pending_tokens = []
        self.pending_k = [[] for _ in self.k]
        self.pending_v = [[] for _ in self.v]

    def _truncate(self, n: int) -> None:
        self.tokens = self.tokens[:n]
        for layer in range(len(self.k)):
            if self.k[layer] is not None:
                self.k[layer], self.v[layer] = self.k[layer][:n], self.v[layer][:n]


def _joined(first: torch.Tensor | None, rest: list[torch.Tensor]) -> torch.Tensor | None:
    parts = ([first] if first is not None else []) + rest
    return torch.cat(parts) if parts else None


class CachedAttention:
    """The `attend` of the draft model's layers for a flat batch: sequence i contributes `num_rows[i]`
    rows after the keys its cache holds (and this step's earlier guesses), attending to those and to its
    own earlier rows. `keep=True`: the rows are kept tokens (their keys and values join the cache);
    else guesses (held aside in the cache's pending lists)."""

    def __init__(self, caches: list[SequenceCache], num_rows: list[int], keep: bool):
        self.caches, self.num_rows, self.keep = caches, num_rows, keep

    def __call__(self, layer: int, q, k, v):
        outs = []
        for cache, qs, ks, vs in zip(self.caches, q.split(self.num_rows), k.split(self.num_rows),
                                     v.split(self.num_rows)):
            past_k = _joined(cache.k[layer], cache.pending_k[layer])
            past_v = _joined(cache.v[layer], cache.pending_v[layer])
            keys = ks if past_k is None else torch.cat([past_k, ks])
            values = vs if past_v is None else torch.cat([past_v, vs])
            mask = None
            if qs.shape[0] > 1:  # row j sees the past and rows 0..j (the causal mask, shifted by the past)
                past = keys.shape[0] - qs.shape[0]
                mask = torch.ones(qs.shape[0], keys.shape[0], dtype=torch.bool, device=qs.device).tril(past)
            o = F.scaled_dot_product_attention(qs.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                               attn_mask=mask, enable_gqa=True)
            outs.append(o.transpose(0, 1))
            if self.keep:
                cache.k[layer], cache.v[layer] = keys, values
            else:
                cache.pending_k[layer].append(ks)
                cache.pending_v[layer].append(vs)
        return torch.cat(outs)
