"""Notebook 09 speculative_decoding: reference solutions. GENERATED from solutions/09_speculative_decoding/09_speculative_decoding.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


import torch
from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.sampler import target_probs


def target_tokens(logits, drafts, draft_probs, params, generator):
    """The target's token at each of the 1 + k positions of a drafted row."""
    choice = logits.argmax(dim=-1).tolist()  # greedy: the answer; sampled: fills the positions nobody reads
    if params.greedy:
        return choice
    p = target_probs(logits, params)
    for i, draft in enumerate(drafts):
        p_d = float(p[i, draft])
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, draft])
        if torch.rand((), generator=generator, dtype=torch.float64).item() * q_d < p_d:
            choice[i] = draft  # kept with probability min(1, p_d / q_d)
            continue
        if draft_probs is None:
            leftover = p[i].clone()  # a certain guess: q is all on the draft
        else:
            leftover = torch.clamp(p[i] - draft_probs[i].to(p.dtype), min=0.0)
        leftover[draft] = 0.0
        choice[i] = int(torch.multinomial(leftover, 1, generator=generator))
        return choice
    choice[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))  # every draft kept
    return choice


class StudentRollback(ContinuousScheduler):
    """course_lib's continuous scheduler, with your acceptance of the drafts."""

    def accept_drafts(self, request, entry, targets):
        """Append the agreeing drafts and the target's token, stop at a stop, move progress and pages back."""
        drafts = entry.draft_token_ids
        reason = None
        appended = 0
        for token in targets:
            request.output_token_ids.append(token)
            appended += 1
            reason = self._stop_reason(request, token)
            # Stop at a stop, at the target's own token (the first disagreement), or after the bonus token.
            if reason is not None or appended > len(drafts) or drafts[appended - 1] != token:
                break
        request.num_computed_tokens = entry.start + appended  # the last token and the kept drafts have K/V
        self.kv.truncate(request, request.num_computed_tokens)  # pages past them held only rejected drafts
        return reason
