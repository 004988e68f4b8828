"""What a request asks of the logits before a token is chosen: min_tokens, logit_bias, penalties.

vLLM's order and formulas (its sampler: min-tokens and logit-bias processors, then
`apply_penalties`), applied to one row of logits before temperature, top-k and top-p:

1. `min_tokens`: until that many tokens were generated, EOS (unless `ignore_eos`) and the stop ids
   get -inf, so the request cannot end early;
2. `logit_bias`: each listed token's logit += its bias;
3. `repetition_penalty` r, on every token seen in the prompt or the output: a positive logit is
   divided by r, a negative one multiplied by r (r > 1 makes a seen token less likely either way);
4. `frequency_penalty` f and `presence_penalty` p, on the tokens generated so far (the output
   only): logit -= f * (times generated) + p * (1 if generated at all).

A request with none of these never reaches this file (`SamplingParams.adjusts_logits`), so
neutral requests pay nothing and keep their logits bit for bit.
"""
from __future__ import annotations

import torch

from .scheduler.sampling import SamplingParams


def adjust_logits(row: torch.Tensor, params: SamplingParams, prompt_ids, output_ids, eos_token_ids=()) -> torch.Tensor:
    """row: [vocab] logits of one request; returns a new float tensor (the input is not changed)."""
    row = row.float() if row.dtype in (torch.float16, torch.bfloat16) else row.clone()
    vocab, device = row.shape[-1], row.device
    if len(output_ids) < params.min_tokens:
        ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        ends = [t for t in ends if 0 <= t < vocab]
        if ends:
            row[torch.tensor(ends, device=device)] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        row[ids] += torch.tensor(list(params.logit_bias.values()), dtype=row.dtype, device=device)
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        seen[torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long, device=device)] = True
        penalised = torch.where(row > 0, row / params.repetition_penalty, row * params.repetition_penalty)
        row = torch.where(seen, penalised, row)
    if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and len(output_ids):
        counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long, device=device),
                                minlength=vocab)[:vocab].to(row.dtype)
        row = row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(row.dtype)
    return row
