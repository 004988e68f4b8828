"""Checks for notebook 09 (speculative decoding): the acceptance rule and the scheduler's rollback.

`target_tokens` (the target's token at every position of a drafted row) is held to its rules three
ways: greedy rows on crafted logits (the argmax up to the first rejection, every drafted pattern);
greedy parity through the real engine, the student's function passed as `LLMEngine(..., verify=)`,
with a drafter of the check's own that drafts each request's true greedy answer right for a chosen
number of tokens and wrong after (every acceptance length happens); and the sampled rule, by
statistics on a vocabulary of five tokens under a fixed seed (deterministic): how often the draft
at each position is kept, what comes instead when it is not, the bonus token when all are kept, on
a draft model's guesses (q given) and on certain guesses (q None) with temperature and top-k. The
distributions are built from fixed templates (tokens permuted by the seed), so every broken rule
misses by many standard deviations on every seed and a correct rule passes with room (z = 6).

The function is always handed `generator=None` (the global generator, which the check seeds): a
torch.Generator cannot cross to the sandbox's side of the grading membrane, so the engine's own
generator never reaches the student's code here.

`StudentRollback.accept_drafts` (a ContinuousScheduler subclass passed as `LLMEngine(...,
scheduler=)`) serves float64 models with the same scripted drafter: after every step, every drafted
row is compared with the rule computed by the check itself from what the runner returned: the tokens
appended (the agreeing prefix and the target's token, cut at the first stop: a stop token, EOS
unless ignore_eos, max_tokens, max_model_len), the finish reason, the progress counter, the pages
kept (a prefix of those the step held, as many as the progress needs) and the pool's books; at the
end every answer equals the model's greedy answer without drafts. The drafter drafts right across
every stop, so each stop falls inside kept drafts. Two runs: pages of 4 with 4 drafts (rollbacks
cross pages); pages of 2 with prefix caching, a small token budget and a pool small enough to preempt.
"""
from __future__ import annotations

from .student_rollback import check_StudentRollback
from .target_tokens import check_target_tokens
