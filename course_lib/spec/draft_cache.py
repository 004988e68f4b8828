"""The draft model's own KV cache: per request, the keys and values of its layers for the tokens it has
seen, so that a drafting step computes only what is new (the tokens kept since the last step, then one
row per guess) instead of rerunning the whole sequence once per guess.

A request's cache holds, per draft layer, one tensor of keys and one of values: first the rows of its
kept tokens (the prompt and the output the target accepted, `tokens`), then the rows of this step's
guesses (`guesses`), in order. At the next step (`catch_up`) the guesses the target kept are the
request's next tokens, so their rows stay; the rows after the first guess it rejected are cut, and only
the target's own token (and a last guess no pass ever fed) is computed again.

A cache is trusted only while its tokens are a prefix of the request's: anything else (a request whose
output was rolled back further than the drafts, a reused request id) starts it over. It lives in plain
per-request tensors, not in the engine's page pool: a deployment would page it like the target's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class SequenceCache:
    """One request's cached tokens and guesses, and each draft layer's keys and values for them, in that
    order ([rows, kv heads, dim])."""

    def __init__(self, num_layers: int):
        self.tokens: list[int] = []  # kept tokens: the first rows
        self.guesses: list[int] = []  # this step's guesses: the rows after them
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        return len(self.tokens)

    def catch_up(self, tokens: list[int]) -> list[int]:
        """Make the cache a prefix of `tokens` (the request's kept tokens now), keeping last step's
        guesses that the target kept; return the tokens still to compute (at least the last one, whose
        row gives the first guess's logits)."""
        n = len(self.tokens)
        if tokens[:n] != self.tokens:
            n = 0
        else:
            for guess, token in zip(self.guesses, tokens[n:]):
                if guess != token:
                    break
                n += 1
        n = min(n, len(tokens) - 1)  # nothing new since the last step: recompute the last token
        self.tokens, self.guesses = tokens[:n], []
        for layer in range(len(self.k)):
            if self.k[layer] is not None:
                self.k[layer], self.v[layer] = self.k[layer][:n], self.v[layer][:n]
        return tokens[n:]


class CachedAttention:
    """The `attend` of the draft model's layers for a flat batch: sequence i contributes `num_rows[i]`
    rows after the rows its cache holds, attending to those and to its own earlier rows; their keys and
    values join the cache (the caller notes their tokens as kept tokens or guesses)."""

    def __init__(self, caches: list[SequenceCache], num_rows: list[int]):
        self.caches, self.num_rows = caches, num_rows

    def __call__(self, layer: int, q, k, v):
        outs = []
        for cache, qs, ks, vs in zip(self.caches, q.split(self.num_rows), k.split(self.num_rows),
                                     v.split(self.num_rows)):
            past_k, past_v = cache.k[layer], cache.v[layer]
            keys = ks if past_k is None else torch.cat([past_k, ks])
            values = vs if past_v is None else torch.cat([past_v, vs])
            mask = None
            if qs.shape[0] > 1:  # row j sees the past and rows 0..j (the causal mask, shifted by the past)
                past = keys.shape[0] - qs.shape[0]
                mask = torch.ones(qs.shape[0], keys.shape[0], dtype=torch.bool, device=qs.device).tril(past)
            o = F.scaled_dot_product_attention(qs.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                               attn_mask=mask, enable_gqa=True)
            outs.append(o.transpose(0, 1))
            cache.k[layer], cache.v[layer] = keys, values
        return torch.cat(outs)
