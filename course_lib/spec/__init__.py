"""Speculative decoding: a cheap drafter guesses the next k tokens of a decoding request, the target
model checks all of them in one forward pass (1 + k rows, like a short prefill chunk), and the
request keeps the longest prefix the target agrees with plus one token of the target's own.

- `ngram.py`: prompt lookup, no model: the tokens that followed the latest earlier occurrence of
  the request's last n tokens.
- `draft_model.py`: a small model (here the target's first layers) decodes k tokens ahead.
- `verify.py`: the target's token at every position of a drafted row: its greedy choice, or, when
  sampling, the rejection rule of Leviathan et al. / Chen et al. (2023), which keeps the output
  distribution exactly the target's.

The scheduler asks the drafter (`SchedulerBase.drafter`) once per step, schedules each drafted
decode as 1 + k tokens that count against the token budget, and in `update` accepts, rolls back
`num_computed_tokens` past the rejected drafts and frees the pages that held only them.
"""
from __future__ import annotations

# EngineConfig(speculative=...) takes one of these; "none" switches speculation off.
DRAFTERS = ("none", "ngram", "draft")


def make_drafter(kind: str, num_speculative_tokens: int, model=None, draft_layers: int = 1, seed: int = 0):
    """The drafter `EngineConfig(speculative=kind)` names, or None for "none"."""
    if kind == "none":
        return None
    if kind == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(num_speculative_tokens)
    if kind == "draft":
        if model is None:
            raise ValueError("speculative='draft' drafts with the model's first layers: it needs a model, "
                             "not the scripted runner (use speculative='ngram' to simulate)")
        from .draft_model import DraftModelDrafter

        return DraftModelDrafter(model, num_speculative_tokens, draft_layers, seed)
    raise ValueError(f"speculative must be one of {DRAFTERS}, got {kind!r}")
