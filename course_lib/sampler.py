"""Turn logits into tokens: greedy, temperature, top-k, top-p, with per-request seeds.

A seeded request draws from its own `torch.Generator` (the runner keeps one per request id),
so its samples do not depend on which other requests share the batch, nor on when it was
preempted and recomputed.

Rows whose request asks for penalties, min_tokens or logit_bias are adjusted first
(logit_adjust.py); the others are left exactly as the model produced them.
"""
from __future__ import annotations

import torch

from .logit_adjust import adjust_logits
from .scheduler.sampling import SamplingParams


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


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list, histories=None,
           eos_token_ids=()) -> list[int]:
    """logits: [len(params), vocab]. One token per row; row i samples with `params[i]`, drawing
    from `generators[i]` (a torch.Generator; unused for greedy rows). `histories[i]` is row i's
    (prompt ids, output ids so far), read only for a row whose params adjust its logits;
    `eos_token_ids` are what `min_tokens` holds back."""
    adjusted = [row for row, p in enumerate(params) if p.adjusts_logits]
    if adjusted:
        logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
        for row in adjusted:
            if histories is None or histories[row] is None:
                raise ValueError(f"row {row} adjusts its logits (penalties, min_tokens, logit_bias) and needs "
                                 f"its request's (prompt ids, output ids); none were given")
            logits[row] = adjust_logits(logits[row], params[row], *histories[row], eos_token_ids)
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; sampled rows are overwritten
    for row, p in enumerate(params):
        if p.greedy:
            continue
        scores = _filter_top_k_top_p(logits[row].float().cpu() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(scores, dim=-1)
        tokens[row] = int(torch.multinomial(probs, 1, generator=generators[row]))
    return tokens


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution `sample` draws a non-greedy row from, for every row of `logits` (one
    request's rows, all with `params`): temperature, then top-k / top-p, then softmax, in float32
    on the CPU (speculative decoding's rejection rule compares these with the drafter's)."""
    rows = [_filter_top_k_top_p(row.float().cpu() / params.temperature, params.top_k, params.top_p)
            for row in logits]
    return torch.softmax(torch.stack(rows), dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: list[int], params: list[SamplingParams], rows: list[int]) -> list:
    """For each of `rows`: (the log-probability of `tokens[row]`, ((id, logprob), ...) of the
    `params[row].logprobs` most likely tokens). Of the model's raw distribution (`logits` as the model
    gave them, before penalties, temperature and top-k / top-p: vLLM's default `logprobs_mode`)."""
    picked = logits[rows]
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    logprobs = torch.log_softmax(picked, dim=-1).cpu()
    chosen = logprobs[torch.arange(len(rows)), torch.tensor([tokens[r] for r in rows])].tolist()
    entries = []
    for i, row in enumerate(rows):
        k = params[row].logprobs or 0
        if k:
            values, ids = torch.topk(logprobs[i], k)
            top = tuple(zip(ids.tolist(), values.tolist()))
        else:
            top = ()
        entries.append((chosen[i], top))
    return entries
