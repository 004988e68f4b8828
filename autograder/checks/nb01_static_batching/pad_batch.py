"""Notebook 01, `pad_batch`: left padding, the mask, and the inputs left as they were."""
from __future__ import annotations

import random

import torch

from autograder._checking import (broke, call, check, expect, expect_unchanged, forbid_calls, is_tensor, kind_of,
                                  pristine)

from ._shared import _course_lib_batching, _expect_value_error


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
                  rng.choice([1, 97, 250])))
    length = rng.randint(2, 5)
    cases.append(([[rng.randrange(3, 90) for _ in range(length)] for _ in range(3)], 0))  # no padding needed
    cases.append(([[rng.randrange(3, 90) for _ in range(rng.randint(1, 6))]], 2))  # a batch of one
    # A pad id that also occurs as a real token: the lengths, not the ids, say what is padding.
    pad = rng.choice([0, 4])
    cases.append(([[pad, pad, 9], [pad], [7, pad], [11, 12, 13, 14]], pad))
    # The longest prompt is not the first one, and a one-token prompt rides with a long one.
    cases.append(([[rng.randrange(3, 90)], [rng.randrange(3, 90) for _ in range(rng.randint(10, 16))]], 0))
    return cases


@check("pad_batch", forbidden=lambda: (_course_lib_batching().pad_batch,))
def check_pad_batch(impl, seed, allow_reference):
    for prompts, pad_id in _pad_cases(random.Random(seed)):
        given = pristine(prompts)  # handed to the student's code; `prompts` stays the check's own
        shown = f"pad_batch({prompts}, pad_id={pad_id})"
        with forbid_calls("pad_batch", [_course_lib_batching()], enabled=not allow_reference):
            result = call(shown, impl, given, pad_id)
        expect_unchanged(shown, "prompts", given, prompts, rule="inputs unchanged")
        expect(type(result) is tuple and len(result) == 2,
               lambda: f"{shown} must return a tuple (ids, mask), got {kind_of(result)}", rule="shapes and dtypes")
        ids, mask = result
        expect(is_tensor(ids) and is_tensor(mask),
               lambda: f"{shown} must return two torch tensors, got {kind_of(ids)} and {kind_of(mask)}",
               rule="shapes and dtypes")
        want_ids, want_mask = _padded(prompts, pad_id)
        shape = (len(prompts), len(want_ids[0]))
        expect(tuple(ids.shape) == shape, f"{shown}: ids must have shape [batch, longest prompt] = {list(shape)}, "
                                          f"got {list(ids.shape)}", rule="shapes and dtypes")
        expect(tuple(mask.shape) == shape, f"{shown}: mask must have shape {list(shape)}, got {list(mask.shape)}",
               rule="shapes and dtypes")
        expect(ids.dtype == torch.long, f"{shown}: ids must be a LongTensor (torch.long, what embeddings take), "
                                        f"got {ids.dtype}", rule="shapes and dtypes")
        expect(mask.dtype == torch.bool, f"{shown}: mask must be a BoolTensor (torch.bool), got {mask.dtype}",
               rule="shapes and dtypes")
        got_ids, got_mask = ids.tolist(), mask.tolist()
        if got_ids != want_ids:
            right, _ = _padded(prompts, pad_id, left=False)
            if got_ids == right and right != want_ids:
                broke("left padding", f"{shown} pads on the RIGHT ({got_ids}); pad on the LEFT ({want_ids}) so that "
                                      "every prompt's last token sits in the last column, where the next token is read")
            broke("left padding", f"{shown}: ids should be {want_ids}, got {got_ids}")
        if got_mask != want_mask:
            inverted = [[not x for x in row] for row in want_mask]
            if got_mask == inverted:
                broke("mask from lengths", f"{shown}: the mask is inverted; it must be True on real tokens and False "
                                           f"on padding ({want_mask})")
            from_ids = [[t != pad_id for t in row] for row in want_ids]
            if got_mask == from_ids:
                broke("mask from lengths", f"{shown}: mask should be {want_mask}, got {got_mask}: the pad id {pad_id} "
                                           "is also a real token here, so the mask must come from the prompts' "
                                           "lengths, not from ids != pad_id")
            broke("mask from lengths", f"{shown}: mask should be {want_mask} (True on real tokens), got {got_mask}")
    for bad, why in (([], "there are no prompts to batch"),
                     ([[5, 6], []], "prompt 1 is empty: it has no last token to predict from")):
        _expect_value_error(f"pad_batch({bad}, pad_id=0)", lambda b=bad: impl(b, 0), why=why)
