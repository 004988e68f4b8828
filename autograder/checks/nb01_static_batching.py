"""Checks for notebook 01 (static batching): left padding, padding waste, the naive batched loop."""
from __future__ import annotations

import copy
import random

import torch

from .. import fixtures
from .._checking import call, check, expect, fail, same_float


# ---------------------------------------------------------------------------------------------
# pad_batch
# ---------------------------------------------------------------------------------------------


def _padded(prompts, pad_id, left=True):
    width = max(len(p) for p in prompts)
    ids, mask = [], []
    for p in prompts:
        pad = width - len(p)
        ids.append(([pad_id] * pad + list(p)) if left else (list(p) + [pad_id] * pad))
        mask.append(([False] * pad + [True] * len(p)) if left else ([True] * len(p) + [False] * pad))
    return ids, mask


def _pad_cases(rng: random.Random):
    cases = [([[5, 6, 7], [8], [9, 10]], 0)]
    batch = rng.randint(4, 6)
    cases.append(([[rng.randrange(3, 90) for _ in range(rng.randint(1, 9))] for _ in range(batch)],
                  rng.choice([0, 1, 97])))
    length = rng.randint(2, 5)
    cases.append(([[rng.randrange(3, 90) for _ in range(length)] for _ in range(3)], 0))  # no padding needed
    cases.append(([[rng.randrange(3, 90) for _ in range(rng.randint(1, 6))]], 2))  # a batch of one
    # A pad id that also occurs as a real token: the mask, not the ids, says what is padding.
    cases.append(([[4, 4, 9], [4], [7, 4]], 4))
    return cases


@check("pad_batch")
def check_pad_batch(impl, seed, allow_reference):
    for prompts, pad_id in _pad_cases(random.Random(seed)):
        original = copy.deepcopy(prompts)
        shown = f"pad_batch({prompts}, pad_id={pad_id})"
        result = call(shown, impl, prompts, pad_id)
        expect(prompts == original, f"{shown} modified its input prompts (now {prompts}): build new tensors instead")
        expect(isinstance(result, tuple) and len(result) == 2,
               f"{shown} must return a tuple (ids, mask), got {type(result).__name__}")
        ids, mask = result
        expect(isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor),
               f"{shown} must return two torch tensors, got {type(ids).__name__} and {type(mask).__name__}")
        want_ids, want_mask = _padded(prompts, pad_id)
        shape = (len(prompts), len(want_ids[0]))
        expect(tuple(ids.shape) == shape, f"{shown}: ids must have shape [batch, longest prompt] = {list(shape)}, "
                                          f"got {list(ids.shape)}")
        expect(tuple(mask.shape) == shape, f"{shown}: mask must have shape {list(shape)}, got {list(mask.shape)}")
        expect(ids.dtype == torch.long, f"{shown}: ids must be a LongTensor (torch.long, what embeddings take), "
                                        f"got {ids.dtype}")
        expect(mask.dtype == torch.bool, f"{shown}: mask must be a BoolTensor (torch.bool), got {mask.dtype}")
        got_ids, got_mask = ids.tolist(), mask.tolist()
        if got_ids != want_ids:
            right, _ = _padded(prompts, pad_id, left=False)
            if got_ids == right and right != want_ids:
                fail(f"{shown} pads on the RIGHT ({got_ids}); pad on the LEFT ({want_ids}) so that every "
                     "prompt's last token sits in the last column, where the next token is read")
            fail(f"{shown}: ids should be {want_ids}, got {got_ids}")
        if got_mask != want_mask:
            inverted = [[not x for x in row] for row in want_mask]
            if got_mask == inverted:
                fail(f"{shown}: the mask is inverted; it must be True on real tokens and False on padding "
                     f"({want_mask})")
            fail(f"{shown}: mask should be {want_mask} (True on real tokens), got {got_mask}")


# ---------------------------------------------------------------------------------------------
# padding_waste
# ---------------------------------------------------------------------------------------------


def _waste(prompt_lens, output_lens):
    batch = len(prompt_lens)
    total = batch * max(prompt_lens) + batch * (max(output_lens) - 1)
    useful = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    return (total - useful) / total


def _waste_hint(p, o, got) -> str:
    b, pm, om = len(p), max(p), max(o)
    alternatives = {
        "max(output_lens) decode steps; the prefill already samples the first output token, so the "
        "batch decodes max(output_lens) - 1 steps": (b * (pm + om) - sum(p) - sum(o)) / (b * (pm + om)),
        "only the decode padding; the prefill pads every prompt to the longest too":
            (b * (om - 1) - sum(n - 1 for n in o)) / max(1, b * (om - 1) + b * pm),
        "only the prefill padding; finished rows keep decoding until the longest output is done":
            (b * pm - sum(p)) / (b * pm + b * (om - 1)),
        "padding / useful slots; the waste is padding / ALL computed slots":
            (b * pm + b * (om - 1) - sum(p) - sum(n - 1 for n in o)) / max(1, sum(p) + sum(n - 1 for n in o)),
    }
    for reason, value in alternatives.items():
        if same_float(got, value) and not same_float(value, _waste(p, o)):
            return f" It looks like you counted {reason}."
    return ""


@check("padding_waste")
def check_padding_waste(impl, seed, allow_reference):
    rng = random.Random(seed)
    cases = [([3, 5], [4, 2]), ([7], [5]), ([4, 4, 4], [1, 1, 1])]
    for _ in range(4):
        batch = rng.randint(2, 8)
        cases.append(([rng.randint(1, 40) for _ in range(batch)], [rng.randint(1, 30) for _ in range(batch)]))
    for prompt_lens, output_lens in cases:
        shown = f"padding_waste({prompt_lens}, {output_lens})"
        got = call(shown, impl, list(prompt_lens), list(output_lens))
        want = _waste(prompt_lens, output_lens)
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"{shown} must return a float (a fraction), got {type(got).__name__} {got!r}")
        if not same_float(got, want):
            b, pm, om = len(prompt_lens), max(prompt_lens), max(output_lens)
            fail(f"{shown} = {got!r}, expected {want!r}: the batch computes {b} x {pm} prefill slots plus "
                 f"{b} x {om - 1} decode slots = {b * pm + b * (om - 1)}, of which "
                 f"{sum(prompt_lens) + sum(n - 1 for n in output_lens)} hold real tokens."
                 f"{_waste_hint(prompt_lens, output_lens, got)}")


# ---------------------------------------------------------------------------------------------
# static_generate
# ---------------------------------------------------------------------------------------------


def _static_cases(seed: int):
    """Two batches on one model: (A) EOS ends some rows early, the rest run to max_tokens; (B) every
    row ends with EOS before max_tokens, so the batch must stop early."""
    rng = random.Random(seed)
    model = fixtures.random_model(seed)
    vocab = model.config.vocab_size
    max_tokens = 10
    candidates = fixtures.random_prompts(rng, 10, vocab, lo=1, hi=12)
    runs = fixtures.greedy(model, candidates, max_tokens)
    # (A) a token in some runs (not at their first position) but not all
    counts = {}
    for i, run in enumerate(runs[:5]):
        for t in set(run[1:-1]):
            counts.setdefault(t, set()).add(i)
    partial = sorted((t for t, rows in counts.items() if 0 < len(rows) < 5), key=lambda t: (-len(counts[t]), t))
    eos_a = partial[0] if partial else runs[0][2]
    # (B) a token shared by 2-3 runs before their last position
    shared = {}
    for i, run in enumerate(runs):
        for t in set(run[:-2]):
            shared.setdefault(t, []).append(i)
    best = max(shared.items(), key=lambda kv: (min(len(kv[1]), 3), -kv[0]))
    eos_b, rows_b = best[0], best[1][:3]
    if len(rows_b) < 2:
        rows_b = [rows_b[0], rows_b[0]]
    cases = [(candidates[:5], max_tokens, eos_a), ([candidates[i] for i in rows_b], max_tokens, eos_b)]
    return [(prompts, mt, eos, fixtures.greedy(model, prompts, mt, [eos])) for prompts, mt, eos in cases]


def _static_hint(row, got, want, eos, all_want) -> str:
    if got[: len(want)] == want and len(got) > len(want):
        return f" It continued after its EOS (id {eos}): cut each list right after its EOS."
    if got == want[:-1] and want[-1] == eos:
        return f" The EOS (id {eos}) itself is missing: keep it as the list's last token."
    if len(got) < len(want) and got == want[: len(got)]:
        return (" It stopped early: a row that finishes keeps its seat, but the batch runs until EVERY row "
                "has produced its EOS (or max_tokens).")
    if got and want and got[0] != want[0]:
        return (" Its very first token is already wrong: pad on the LEFT, mask the padding out of attention, "
                "and read each row's next token from the last column.")
    return ""


@check("static_generate")
def check_static_generate(impl, seed, allow_reference):
    for prompts, max_tokens, eos, want in _static_cases(seed):
        model = fixtures.random_model(seed)
        forwards = [0]
        model.register_forward_pre_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
        original = copy.deepcopy(prompts)
        shown = f"static_generate(model, <{len(prompts)} prompts of lengths {[len(p) for p in prompts]}>, max_tokens={max_tokens}, eos_id={eos})"
        got = call(shown, impl, model, prompts, max_tokens, eos)
        expect(prompts == original, f"{shown} modified its input prompts: copy them before appending tokens")
        expect(isinstance(got, (list, tuple)) and len(got) == len(prompts),
               f"{shown} must return one list of token ids per prompt ({len(prompts)}), got {type(got).__name__}"
               + (f" of length {len(got)}" if hasattr(got, "__len__") else ""))
        rows = []
        for i, row in enumerate(got):
            expect(isinstance(row, (list, tuple)), f"{shown}: row {i} must be a list of ints, got {type(row).__name__}")
            try:
                rows.append([int(t) for t in row])
            except (TypeError, ValueError):
                fail(f"{shown}: row {i} must be a list of ints, got {row!r:.80}")
        for i, (g, w) in enumerate(zip(rows, want)):
            if g != w:
                fail(f"{shown}: row {i} (prompt {prompts[i]}) should be {w} (greedy, cut after EOS), got {g}."
                     f"{_static_hint(i, g, w, eos, want)}")
        steps = max(len(w) for w in want)
        expect(forwards[0] <= steps + 1,
               lambda: f"{shown} ran {forwards[0]} forward passes, but the batch needs only {steps} steps: "
                       + ("every row had finished: stop as soon as all rows are done."
                          if all(w[-1] == eos for w in want) and steps < max_tokens else
                          "a static batch runs ALL its prompts in each forward pass (not one prompt at a time)."))
