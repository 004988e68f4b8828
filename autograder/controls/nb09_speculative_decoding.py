"""Correct versions of notebook 09's exercises written differently from the answer key: each must pass
its check on every graded seed (a check that fails an honest, different solution is wrong)."""
from __future__ import annotations

import torch

from course_lib.sampler import target_probs
from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.scheduler.request import FinishReason


def _draw(weights, generator) -> int:
    """One index drawn in proportion to `weights` by inverting the cumulative sum (no torch.multinomial)."""
    cumulative = torch.cumsum(weights.double(), dim=0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    index = int(torch.searchsorted(cumulative, u, right=True))
    return min(index, len(weights) - 1)


def target_tokens_inverse_cdf(logits, drafts, draft_probs, params, generator):
    """Draws every uniform first, compares u < p/q by division, samples by inverting the CDF."""
    k = len(drafts)
    out = [int(t) for t in torch.argmax(logits, dim=1)]
    if params.temperature == 0.0:
        return out
    p = target_probs(logits, params).double()
    if draft_probs is None:
        q = torch.zeros(k, p.shape[1], dtype=torch.float64)
        q[torch.arange(k), torch.tensor(drafts, dtype=torch.long)] = 1.0
    else:
        q = draft_probs.double()
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64)
    position = 0
    while position < k:
        d = drafts[position]
        if q[position, d] > 0 and uniforms[position] < p[position, d] / q[position, d]:
            out[position] = d
            position += 1
            continue
        residual = torch.where(p[position] > q[position], p[position] - q[position], torch.zeros_like(p[position]))
        residual[d] = 0.0
        out[position] = _draw(residual, generator)
        return out
    out[k] = _draw(p[k], generator)
    return out


class RollbackCountsFirst(ContinuousScheduler):
    """Counts the agreeing drafts first, then appends in one slice, cut at the first stop found by its own test."""

    def _ends(self, request, token) -> FinishReason | None:
        params = request.sampling_params
        if token in params.stop_token_ids:
            return FinishReason.STOP
        if not params.ignore_eos and token in self.eos_token_ids:
            return FinishReason.EOS
        total = len(request.prompt_token_ids) + len(request.output_token_ids)
        if len(request.output_token_ids) >= params.max_tokens or total >= self.kv.max_model_len:
            return FinishReason.LENGTH
        return None

    def accept_drafts(self, request, entry, targets):
        drafts = list(entry.draft_token_ids)
        agree = next((i for i, (d, t) in enumerate(zip(drafts, targets)) if d != t), len(drafts))
        accepted = list(targets[: agree + 1])
        reason = None
        count = 0
        for token in accepted:
            request.output_token_ids.append(token)
            count += 1
            reason = self._ends(request, token)
            if reason:
                break
        start = entry.start
        request.num_computed_tokens = start + count
        self.kv.truncate(request, start + count)
        return reason


CONTROLS = {
    "target_tokens": [target_tokens_inverse_cdf],
    "StudentRollback": [RollbackCountsFirst],
}
