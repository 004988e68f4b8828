"""Turn logits into tokens: greedy, temperature, top-k, top-p, with per-request seeds.

A seeded request draws from its own `torch.Generator`, so its samples do not depend on
which other requests share the batch, nor on when it was preempted and recomputed.
"""
from __future__ import annotations

import torch

from .scheduler.request import Request


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first always stays).
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, requests: list[Request], default_generator: torch.Generator) -> list[int]:
    """logits: [len(requests), vocab]. One token per request."""
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; sampled rows are overwritten
    for row, request in enumerate(requests):
        params = request.sampling_params
        if params.greedy:
            continue
        if params.seed is not None and request.generator is None:
            request.generator = torch.Generator(device="cpu").manual_seed(params.seed)
        gen = request.generator if params.seed is not None else default_generator
        scores = _filter_top_k_top_p(logits[row].float().cpu() / params.temperature, params.top_k, params.top_p)
        probs = torch.softmax(scores, dim=-1)
        tokens[row] = int(torch.multinomial(probs, 1, generator=gen))
    return tokens
