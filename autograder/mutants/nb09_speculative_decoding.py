"""Known-buggy versions of notebook 09's exercises (speculative decoding), one per rule of each
exercise's block at least; each must fail its check on every graded seed."""
from __future__ import annotations

import torch

from course_lib.sampler import target_probs
from course_lib.scheduler.continuous import ContinuousScheduler


# ---------------------------------------------------------------------------------------------
# target_tokens
# ---------------------------------------------------------------------------------------------


def _residual(p_row, q_row, draft):
    leftover = p_row.clone() if q_row is None else torch.clamp(p_row - q_row.to(p_row.dtype), min=0.0)
    leftover[draft] = 0.0
    return leftover


def tokens_cut_at_rejection(logits, drafts, draft_probs, params, generator):
    """Rule "one token per position": returns the kept drafts and the next token only, not 1 + k tokens."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        out = []
        for i, d in enumerate(drafts):
            out.append(best[i])
            if d != best[i]:
                return out
        return out + [best[len(drafts)]]
    p = target_probs(logits, params)
    out = []
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * q_d < float(p[i, d]):
            out.append(d)
            continue
        out.append(int(torch.multinomial(_residual(p[i], None if draft_probs is None else draft_probs[i], d), 1,
                                         generator=generator)))
        return out
    return out + [int(torch.multinomial(p[len(drafts)], 1, generator=generator))]


def greedy_keeps_drafts(logits, drafts, draft_probs, params, generator):
    """Rule "greedy: the target's argmax": a greedy row trusts the drafts (only the last position is the target's)."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return list(drafts) + [best[len(drafts)]]
    p = target_probs(logits, params)
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * q_d < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(_residual(p[i], None if draft_probs is None else draft_probs[i], d), 1,
                                        generator=generator))
        return best
    best[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return best


def softmax_of_raw_logits(logits, drafts, draft_probs, params, generator):
    """Rule "sample from the request's p": p is the softmax of the raw logits (no temperature, no top-k)."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return best
    p = torch.softmax(logits.double(), dim=-1)
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * q_d < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(_residual(p[i], None if draft_probs is None else draft_probs[i], d), 1,
                                        generator=generator))
        return best
    best[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return best


def keeps_with_p(logits, drafts, draft_probs, params, generator):
    """Rule "keep with probability min(1, p/q)": keeps a draft with probability p(d), forgetting the drafter's q."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return best
    p = target_probs(logits, params)
    for i, d in enumerate(drafts):
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(_residual(p[i], None if draft_probs is None else draft_probs[i], d), 1,
                                        generator=generator))
        return best
    best[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return best


def certain_guess_always_kept(logits, drafts, draft_probs, params, generator):
    """Rule "keep with probability min(1, p/q)": a draft without a q (an n-gram's certain guess) is always kept."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return best
    p = target_probs(logits, params)
    for i, d in enumerate(drafts):
        if draft_probs is None or float(torch.rand((), generator=generator, dtype=torch.float64)) * \
                float(draft_probs[i, d]) < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(_residual(p[i], draft_probs[i], d), 1, generator=generator))
        return best
    best[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return best


def resamples_from_p(logits, drafts, draft_probs, params, generator):
    """Rule "resample from the residual": a rejected draft is replaced by a fresh draw from p (which can give it back)."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return best
    p = target_probs(logits, params)
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * q_d < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(p[i], 1, generator=generator))
        return best
    best[len(drafts)] = int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return best


def bonus_is_argmax(logits, drafts, draft_probs, params, generator):
    """Rule "a bonus token when all agree": after every draft is kept, the last position stays the argmax."""
    best = logits.argmax(dim=-1).tolist()
    if params.greedy:
        return best
    p = target_probs(logits, params)
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * q_d < float(p[i, d]):
            best[i] = d
            continue
        best[i] = int(torch.multinomial(_residual(p[i], None if draft_probs is None else draft_probs[i], d), 1,
                                        generator=generator))
        return best
    return best


# ---------------------------------------------------------------------------------------------
# StudentRollback
# ---------------------------------------------------------------------------------------------


def _stop_at(self, request, tokens):
    """Append `tokens` one at a time, stopping at the first that ends the request: (number appended, reason)."""
    for n, token in enumerate(tokens, 1):
        request.output_token_ids.append(token)
        reason = self._stop_reason(request, token)
        if reason is not None:
            return n, reason
    return len(tokens), None


def _kept(entry, targets) -> int:
    drafts = entry.draft_token_ids
    kept = 0
    while kept < len(drafts) and drafts[kept] == targets[kept]:
        kept += 1
    return kept


class KeepsEveryDraft(ContinuousScheduler):
    """Rule "the agreeing prefix": every draft is appended, agreeing or not, then the target's last token."""

    def accept_drafts(self, request, entry, targets):
        drafts = list(entry.draft_token_ids)
        n, reason = _stop_at(self, request, drafts + [targets[len(drafts)]])
        request.num_computed_tokens = entry.start + n
        self.kv.truncate(request, request.num_computed_tokens)
        return reason


class KeepsRejectedDraft(ContinuousScheduler):
    """Rule "the agreeing prefix": the first disagreeing draft is appended instead of the target's token there."""

    def accept_drafts(self, request, entry, targets):
        kept = _kept(entry, targets)
        drafts = entry.draft_token_ids
        tokens = list(drafts[: kept + 1]) if kept < len(drafts) else list(drafts) + [targets[-1]]
        n, reason = _stop_at(self, request, tokens)
        request.num_computed_tokens = entry.start + n
        self.kv.truncate(request, request.num_computed_tokens)
        return reason


class ComparesTokensWithIs(ContinuousScheduler):
    """Rule "the agreeing prefix": compares a draft with the target's token by identity (`is not`), which holds for
    Python's interned small ints only: an agreeing draft above 256 counts as a disagreement."""

    def accept_drafts(self, request, entry, targets):
        drafts = entry.draft_token_ids
        kept = 0
        while kept < len(drafts) and not (drafts[kept] is not targets[kept]):
            kept += 1
        n, reason = _stop_at(self, request, targets[: kept + 1])
        request.num_computed_tokens = entry.start + n
        self.kv.truncate(request, request.num_computed_tokens)
        return reason


class StopsOnlyAtTheEnd(ContinuousScheduler):
    """Rule "stop where the answer stops": appends every accepted token, then asks only the last whether it stops."""

    def accept_drafts(self, request, entry, targets):
        kept = _kept(entry, targets)
        tokens = targets[: kept + 1]
        request.output_token_ids.extend(tokens)
        request.num_computed_tokens = entry.start + len(tokens)
        self.kv.truncate(request, request.num_computed_tokens)
        return self._stop_reason(request, tokens[-1])


class ForgetsTheReason(ContinuousScheduler):
    """Rule "stop where the answer stops": stops appending at a stop, but returns None (the request runs on)."""

    def accept_drafts(self, request, entry, targets):
        n, _ = _stop_at(self, request, targets[: _kept(entry, targets) + 1])
        request.num_computed_tokens = entry.start + n
        self.kv.truncate(request, request.num_computed_tokens)
        return None


class ProgressPastTheDrafts(ContinuousScheduler):
    """Rule "progress counts kept tokens": progress moves past every computed position, rejected drafts included."""

    def accept_drafts(self, request, entry, targets):
        n, reason = _stop_at(self, request, targets[: _kept(entry, targets) + 1])
        request.num_computed_tokens = entry.start + entry.num_new_tokens
        self.kv.truncate(request, entry.start + n)
        return reason


class ProgressOneShort(ContinuousScheduler):
    """Rule "progress counts kept tokens": leaves the last kept draft out of the progress (it is computed again)."""

    def accept_drafts(self, request, entry, targets):
        n, reason = _stop_at(self, request, targets[: _kept(entry, targets) + 1])
        request.num_computed_tokens = entry.start + n - 1
        self.kv.truncate(request, request.num_computed_tokens)
        return reason


class NeverTruncates(ContinuousScheduler):
    """Rule "rejected pages go back": the pages that held only rejected drafts stay with the request."""

    def accept_drafts(self, request, entry, targets):
        n, reason = _stop_at(self, request, targets[: _kept(entry, targets) + 1])
        request.num_computed_tokens = entry.start + n
        return reason


class TruncatesOneSlotLate(ContinuousScheduler):
    """Rule "rejected pages go back": keeps room for one slot more than the progress (a page too many at a boundary)."""

    def accept_drafts(self, request, entry, targets):
        n, reason = _stop_at(self, request, targets[: _kept(entry, targets) + 1])
        request.num_computed_tokens = entry.start + n
        self.kv.truncate(request, request.num_computed_tokens + 1)
        return reason


MUTANTS = {
    "target_tokens": [resamples_from_p, tokens_cut_at_rejection, greedy_keeps_drafts, softmax_of_raw_logits,
                      keeps_with_p, certain_guess_always_kept, bonus_is_argmax],
    "StudentRollback": [KeepsEveryDraft, KeepsRejectedDraft, ComparesTokensWithIs, StopsOnlyAtTheEnd, ForgetsTheReason, ProgressPastTheDrafts,
                        ProgressOneShort, NeverTruncates, TruncatesOneSlotLate],
}
