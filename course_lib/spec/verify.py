"""The target model's token at every position of a drafted row (what `ModelRunner` returns for it).

A drafted row computes the request's last token and its k drafts d_1 .. d_k in one forward pass,
so the target has a distribution p_i at each position i = 0 .. k: p_0 for the token after the last
one, p_i for the token after d_i. The scheduler keeps the drafts up to the first position where
the target's token differs from the draft, then the target's token there (`SchedulerBase.update`).
This file decides the target's token at each position so that this rule is right:

- greedy: the target's argmax at every position; a draft survives iff it is the argmax, so the
  output is token for token what decoding without drafts gives.
- sampled (Leviathan et al. 2023, Chen et al. 2023): at position i the draft d = d_{i+1}, drawn
  from the drafter's distribution q_i, is kept with probability min(1, p_i(d) / q_i(d)); if it is
  not, the token is drawn from max(0, p_i - q_i), renormalised, which never gives d back. If every
  draft is kept, the token after the last one is drawn from p_k. Each emitted token is then
  distributed exactly as p, whatever q is. An n-gram draft is a certain guess (q_i puts all its
  mass on d): it survives with probability p_i(d), and the correction is p_i without d.
Positions after the first rejection are never read; they hold the target's argmax.
"""
from __future__ import annotations

import torch

from ..sampler import target_probs


def target_tokens(logits: torch.Tensor, drafts, draft_probs, params, generator) -> list[int]:
    """logits: [1 + k, vocab], the target's rows for one drafted request; drafts: its k tokens;
    draft_probs: [k, vocab] (the drafter's q) or None for certain guesses; params: its
    SamplingParams; generator: its torch.Generator. Returns 1 + k tokens (see the module doc)."""
    tokens = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return tokens
    p = target_probs(logits, params)  # [1 + k, vocab] on the CPU, float32/float64
    uniforms = torch.rand(len(drafts), generator=generator, dtype=torch.float64).tolist()
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if uniforms[i] * q_d < float(p[i, d]):  # kept with probability min(1, p / q)
            tokens[i] = d
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - draft_probs[i].to(p.dtype)).clamp_(min=0.0)
        residual[d] = 0.0  # (rounding: a rejected draft can never come back)
        if float(residual.sum()) <= 0.0:  # only when q_i(d) rounds to 0 where p_i(d) is 0 too
            residual = p[i]
        tokens[i] = int(torch.multinomial(residual, 1, generator=generator))
        return tokens
    tokens[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return tokens
