"""Checks for notebook 01 (static batching): left padding, the naive batched loop with and without
a KV cache, padding waste.

The two loops are held to the same greedy tokens as the plain float64 model AND to the shape of
every forward pass they make (counted at the model's embedding, so `model(...)` and
`model.forward(...)` are both seen): a static batch carries every row in every pass; without a
cache pass k recomputes the whole rectangle `B x (L + k)`; with one, the prefill computes the
padded prompts `B x L` once and every later pass feeds exactly one new token per row.
"""
from __future__ import annotations

import contextlib
import random
import sys

import torch

from .. import fixtures
from .._checking import (broke, call, check, difference, expect, forbid_calls, is_tensor, kind_of, plain_float,
                         plain_int, pristine, same_float, show)


def _course_lib_batching():
    import course_lib.static_batching as module

    return module


def _expect_value_error(shown: str, fn, *args, why: str) -> None:
    """`fn(*args)` must raise ValueError (bad input gets a clear error, not a silent answer): the rule
    "bad input" of both exercises that state one."""
    try:
        got = fn(*args)
    except ValueError:
        return
    except (NotImplementedError, AssertionError):
        raise
    except Exception as exc:  # noqa: BLE001
        broke("bad input", f"{shown} raised {type(exc).__name__}: {exc}; expected a ValueError ({why})")
    broke("bad input", f"{shown} returned {got!r:.120}; expected a ValueError ({why})")


def _expect_unchanged(shown: str, what: str, handed, kept) -> None:
    """The rule "inputs unchanged": what the student's code was handed still equals the check's own
    copy of it (the expected answer always comes from that copy)."""
    found = difference(handed, kept, f"`{what}`")
    if found:
        found = found.replace(" expected ", " it was ", 1)
        broke("inputs unchanged", f"{shown} changed the check's input `{what}` ({found}): "
                                  "your code must leave what it is given as it was (compute on a copy); the check's "
                                  f"expected answer comes from its own copy of `{what}`, never from what your code "
                                  "hands back")


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
        _expect_unchanged(shown, "prompts", given, prompts)
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


# ---------------------------------------------------------------------------------------------
# padding_waste
# ---------------------------------------------------------------------------------------------


def _waste(prompt_lens, output_lens):
    batch = len(prompt_lens)
    total = batch * max(prompt_lens) + batch * (max(output_lens) - 1)
    useful = sum(prompt_lens) + sum(n - 1 for n in output_lens)
    return (total - useful) / total


def _waste_broken_rule(p, o, got) -> tuple[str, str]:
    """(rule, hint) for a wrong fraction: a common wrong count by its value, else the rule the case isolates
    (the first cases each have padding of one kind only)."""
    b, pm, om = len(p), max(p), max(o)
    alternatives = [
        ("decode until the longest", "max(output_lens) decode steps; the prefill already samples the first "
         "output token, so the batch decodes max(output_lens) - 1 steps",
         (b * (pm + om) - sum(p) - sum(o)) / (b * (pm + om))),
        ("prefill at the longest", "only the decode padding; the prefill pads every prompt to the longest too",
         (b * (om - 1) - sum(n - 1 for n in o)) / max(1, b * (om - 1) + b * pm)),
        ("decode until the longest", "only the prefill padding; finished rows keep decoding until the longest "
         "output is done", (b * pm - sum(p)) / (b * pm + b * (om - 1))),
        ("padding over all computed", "padding / useful slots; the waste is padding / ALL computed slots",
         (b * pm + b * (om - 1) - sum(p) - sum(n - 1 for n in o)) / max(1, sum(p) + sum(n - 1 for n in o))),
        ("padding over all computed", "the useful fraction; the question is the padding fraction (1 - useful)",
         (sum(p) + sum(n - 1 for n in o)) / (b * pm + b * (om - 1))),
    ]
    want = _waste(p, o)
    for rule, reason, value in alternatives:
        if same_float(got, value) and not same_float(value, want):
            return rule, f" It looks like you counted {reason}."
    if abs(got - want) < 1e-4:
        return "exact", " It is close, not exact: compute the fraction from the counts, do not round it."
    if b == 1:
        return "real slots", " A batch of one request computes only its own tokens: nothing is padding."
    if om == 1:
        return "prefill at the longest", " Every answer here is the prefill's token alone: no decode step runs."
    if len(set(p)) == 1:
        return "decode until the longest", " The prompts all have one length here: the padding is all in the decode."
    return "padding over all computed", ""


def _waste_cases(rng: random.Random):
    # First one request (no padding at all), then padding from the prefill alone (every answer is the
    # prefill's token), then from the decode alone (equal prompts): a wrong count fails on the case
    # that isolates the rule it broke. Then both kinds together.
    cases = [([7], [5]), ([3, 5], [1, 1]), ([4, 4, 4], [1, 1, 1]), ([6, 6, 6], [9, 3, 1]), ([6, 6], [9, 9]),
             ([3, 5], [4, 2]), ([2, 9, 4], [1, 12, 1])]
    for _ in range(4):
        batch = rng.randint(2, 8)
        cases.append(([rng.randint(1, 40) for _ in range(batch)], [rng.randint(1, 30) for _ in range(batch)]))
    cases.append(([rng.randint(1, 20) for _ in range(32)], [20] * 31 + [1000]))  # one long answer among many
    # A big batch (300 > 256): lengths above CPython's cached small ints, so comparing them with `is`
    # instead of `==` shows here.
    cases.append(([rng.randint(1, 50) for _ in range(300)], [rng.randint(1, 50) for _ in range(300)]))
    return cases


def _show_lens(lens) -> str:
    """A list of lengths as a message shows it: whole up to 40, else its start and its size."""
    return str(lens) if len(lens) <= 40 else f"[{', '.join(map(str, lens[:8]))}, ... ({len(lens)} lengths)]"


@check("padding_waste", forbidden=lambda: (_course_lib_batching().padding_waste,))
def check_padding_waste(impl, seed, allow_reference):
    for prompt_lens, output_lens in _waste_cases(random.Random(seed)):
        shown = f"padding_waste({_show_lens(prompt_lens)}, {_show_lens(output_lens)})"
        with forbid_calls("padding_waste", [_course_lib_batching()], enabled=not allow_reference):
            got = call(shown, impl, list(prompt_lens), list(output_lens))
        want = _waste(prompt_lens, output_lens)
        expect(plain_float(got) is not None, lambda: f"{shown} must return a float (a fraction), got {kind_of(got)} "
                                                     f"{show(got)}", rule="padding over all computed")
        got = plain_float(got)
        if not same_float(got, want):
            rule, hint = _waste_broken_rule(prompt_lens, output_lens, got)
            broke(rule, f"{shown} = {got!r}, expected {want!r}.{hint}")
    for p, o, why in (([3, 5, 2], [4, 2], "3 prompt lengths but 2 output lengths: one of each per request"),
                      ([3, 5], [4, 2, 1], "2 prompt lengths but 3 output lengths: one of each per request"),
                      ([], [], "no requests: the fraction of nothing is undefined"),
                      ([3, 5], [4, 0], "an output length of 0: the prefill always yields a first token"),
                      ([0, 5], [4, 2], "a prompt length of 0: every request has at least one prompt token")):
        _expect_value_error(f"padding_waste({p}, {o})", lambda p=p, o=o: impl(list(p), list(o)), why=why)


# ---------------------------------------------------------------------------------------------
# static_generate and static_generate_cached: the same batches, two pass shapes
# ---------------------------------------------------------------------------------------------


def _pick(rng, tokens):
    return sorted(tokens)[rng.randrange(len(tokens))] if tokens else None


def _static_cases(seed: int):
    """The cases, A-D on fixtures.random_model(seed), each checked to hold:

    A  some rows stop at their EOS, the others run to max_tokens (the batch runs to max_tokens);
    B  every row stops at its EOS before max_tokens (the batch must stop early);
    C  max_tokens=1 (the prefill pass alone answers);
    D  equal-length prompts (no padding) and a batch of one (prompt of one token);
    E  an EOS id above 256, on another model (`_big_vocab_case`).
    Each entry: (model, label, prompts, max_tokens, eos_id, the model's own greedy rows)."""
    rng = random.Random(seed)
    model = fixtures.random_model(seed)
    vocab, max_tokens = model.config.vocab_size, 10
    for _attempt in range(20):
        candidates = fixtures.random_prompts(rng, 10, vocab, lo=1, hi=12)
        candidates[1][0] = 0  # a real token equal to the pad id (0): only the lengths say what is padding
        candidates[2] = candidates[2][:1] if len(candidates[2]) > 1 else candidates[2]  # a one-token prompt
        runs = fixtures.greedy(model, candidates, max_tokens)
        # A: a token seen mid-run in some of the first 5 runs and nowhere in at least one of them
        first5 = runs[:5]
        mid = {t for run in first5 for t in run[1:-1]}
        eos_a = _pick(rng, [t for t in mid if any(t not in run for run in first5)
                            and sum(t in run[1:-1] for run in first5) >= 2])
        # B: a token in the first 7 positions of 3 runs
        early = {}
        for i, run in enumerate(runs):
            for t in set(run[:-3]):
                early.setdefault(t, []).append(i)
        shared = [t for t, rows in early.items() if len(rows) >= 3]
        eos_b = _pick(rng, shared)
        if eos_a is not None and eos_b is not None:
            break
    else:  # pragma: no cover - twenty unlucky draws
        raise RuntimeError(f"internal: no usable static batching cases for seed {seed}")
    rows_b = sorted(rng.sample(early[eos_b], 3))
    same_len = rng.randint(2, 6)
    cases = [
        ("A", candidates[:5], max_tokens, eos_a),
        ("B", [candidates[i] for i in rows_b], max_tokens, eos_b),
        ("C", [candidates[i] for i in (5, 6, 2)], 1, eos_a),
        ("D", [[rng.randrange(3, vocab) for _ in range(same_len)] for _ in range(2)], rng.randint(2, 4), eos_b),
        ("D", [[rng.randrange(3, vocab)]], rng.randint(3, 6), eos_a),
    ]
    cases = [(model, label, p, mt, eos) for label, p, mt, eos in cases] + [_big_vocab_case(seed)]
    return [(m, label, p, mt, eos, fixtures.greedy(m, p, mt, [eos])) for m, label, p, mt, eos in cases]


def _big_vocab_case(seed: int):
    """E: an EOS id above 256, as in every real vocabulary (Llama-3's is 128009), on a 400-token model:
    Python caches the ints up to 256, so a loop that compares token ids with `is` instead of `==` never
    sees this EOS. Row 0 stops at it (its 2nd to 4th token), row 1 never meets it."""
    rng = random.Random(5000 + seed)
    model = fixtures.random_model(seed, vocab_size=400)
    prompts = fixtures.random_prompts(rng, 24, 400, lo=2, hi=8)
    runs = fixtures.greedy(model, prompts, 6)
    for i, run in enumerate(runs):
        for k in (1, 2, 3):
            if run[k] > 256 and run[k] not in run[:k]:
                other = next((j for j, r in enumerate(runs) if run[k] not in r), None)
                if other is not None:
                    return model, "E", [prompts[i], prompts[other]], 6, run[k]
    raise RuntimeError(f"internal: no EOS id above 256 in the 400-token model's runs for seed {seed}")


def _static_broken_rule(got, want, eos) -> tuple[str, str]:
    """(rule, hint) for a row whose tokens differ from the model's own greedy answer."""
    if got[: len(want)] == want and len(got) > len(want):
        if want and want[-1] == eos:
            why = (" (an id above 256: compare token ids with ==, not `is`; Python shares only the ints up "
                   "to 256)") if eos > 256 else ""
            return "eos ends a row", f" It continued after its EOS (id {eos}){why}."
        return "max_tokens", f" It is longer than max_tokens={len(want)}."
    if got == want[:-1] and want[-1] == eos:
        return "eos ends a row", f" The EOS (id {eos}) itself is missing: it is the list's last token."
    if len(got) < len(want) and got == want[: len(got)]:
        return "stop when all done", (" It stopped early: the batch runs until EVERY row has produced its EOS "
                                          "(or max_tokens).")
    if got and want and got[0] != want[0]:
        return "greedy, row by row", (" Its very first token is already wrong: the first token comes from each "
                                      "row's own last prompt token, with the padding masked out.")
    return "greedy, row by row", (" The first tokens agree and then they part: what is fed after the first "
                                  "step, or how the new column is masked, differs from the model alone.")


@contextlib.contextmanager
def _count_tokens_per_pass(model):
    """Record each forward pass of `model` at its embedding: the ids it feeds, and the positions the model's
    forward was given with them (read from that forward's own frame, so `model(...)` and `model.forward(...)`
    are both seen; None where they cannot be read). The hook is reachable through the model the student's
    code is handed: a call of it that does not come from torch running the module (the student's code
    calling it to forge a count) is noted in `forged`."""
    import torch.nn.modules.module as torch_module

    passes: list[list[int]] = []
    positions: list[list[int] | None] = []
    forged: list[str] = []
    torch_file = torch_module.__file__
    forward_code = type(model).forward.__code__

    def count(module, args):
        caller = sys._getframe(1)
        if caller.f_code.co_filename != torch_file:
            forged.append("called directly")
            return
        ids = args[0]
        passes.append([int(t) for t in ids.reshape(-1).tolist()] if is_tensor(ids) else [])
        frame, found = caller, None
        for _ in range(8):  # embedding <- torch's call machinery <- the model's forward
            frame = frame.f_back
            if frame is None:
                break
            if frame.f_code is forward_code:
                pos = frame.f_locals.get("positions")
                if is_tensor(pos) and pos.numel() == len(passes[-1]):
                    found = [int(t) for t in pos.reshape(-1).tolist()]
                break
        positions.append(found)

    handle = model.embed_tokens.register_forward_pre_hook(count)
    try:
        yield passes, positions, forged
    finally:
        handle.remove()


def _run_static(name, impl, model, label, prompts, max_tokens, eos, allow_reference):
    given = pristine(prompts)  # handed to the student's code; `prompts` stays the check's own
    shown = (f"{name}(model, <case {label}: {len(prompts)} prompts of lengths {[len(p) for p in prompts]}>, "
             f"max_tokens={max_tokens}, eos_id={eos})")
    with _count_tokens_per_pass(model) as (fed, positions, forged), \
            forbid_calls(name, [_course_lib_batching()], enabled=not allow_reference):
        got = call(shown, impl, model, given, max_tokens, eos)
    expect(not forged, f"{shown} called the check's counter of forward passes (a hook on the model's embedding) "
                       "itself: run the model, the check counts its passes")
    _expect_unchanged(shown, "prompts", given, prompts)
    expect(type(got) in (list, tuple) and len(got) == len(prompts),
           lambda: f"{shown} must return one list of token ids per prompt ({len(prompts)}), got {kind_of(got)}"
                   + (f" of length {len(got)}" if type(got) in (list, tuple) else ""), rule="greedy, row by row")
    rows = []
    for i, row in enumerate(got):
        expect(type(row) in (list, tuple), lambda: f"{shown}: row {i} must be a list of ints, got {kind_of(row)}",
               rule="greedy, row by row")
        ints = [plain_int(t) for t in row]
        bad = next((k for k, v in enumerate(ints) if v is None), None)
        if bad is not None:
            broke("greedy, row by row", f"{shown}: row {i} must be a list of ints (token ids), but item {bad} is "
                                        f"{kind_of(row[bad])} {show(row[bad])}")
        rows.append(ints)
    return shown, rows, [len(ids) for ids in fed], fed, positions


def _expect_tokens(shown, prompts, rows, want, eos):
    for i, (g, w) in enumerate(zip(rows, want)):
        if g != w:
            rule, hint = _static_broken_rule(g, w, eos)
            broke(rule, f"{shown}: row {i} (prompt {prompts[i]}) should be {w} (what the model alone generates "
                        f"greedily for it), got {g}.{hint}")


def _expect_pass_count(shown, passes, want, max_tokens, eos):
    steps = max(len(w) for w in want)
    if len(passes) > steps:
        why = ("every row had finished (EOS): stop as soon as all rows are done"
               if steps < max_tokens else f"the longest row is done at max_tokens={max_tokens}")
        broke("stop when all done", f"{shown} ran {len(passes)} forward passes; the batch needs exactly {steps} "
                                        f"(one per generated column: the longest row has {steps} tokens): {why}.")
    expect(len(passes) == steps, f"{shown} ran {len(passes)} forward passes for rows of {[len(w) for w in want]} "
                                 f"tokens: expected exactly {steps}, one per generated column",
           rule="stop when all done")


def _expect_positions(shown, prompts, want, fed, positions):
    """Rule "no gaps in positions": within each row, each real token sits one position after the row's
    previous real token. Read from the positions the model was given, for a row's real slots only, and
    only while the ids it is fed are the ones the model's own answer gives (after a wrong token the
    tokens' rule speaks). Left padding, as pad_batch builds it: a row's prompt ends the prefill's row."""
    B, L = len(prompts), max(len(p) for p in prompts)
    if not positions or positions[0] is None or len(fed[0]) != B * L:
        return
    for r, prompt in enumerate(prompts):
        n = len(prompt)
        row_ids = fed[0][r * L:(r + 1) * L]
        if row_ids[L - n:] != list(prompt):
            continue
        row_pos = positions[0][r * L:(r + 1) * L][L - n:]
        for j in range(1, n):
            if row_pos[j] != row_pos[j - 1] + 1:
                broke("no gaps in positions",
                      f"{shown}: in the prefill, row {r}'s prompt tokens {j - 1} and {j} were given positions "
                      f"{row_pos[j - 1]} and {row_pos[j]}: each real token sits one position after the previous one "
                      f"(padding takes no position): the row's positions were {row_pos}")
        last = row_pos[-1]
        for k in range(1, len(fed)):
            if k >= len(want[r]) or positions[k] is None or len(fed[k]) != B or fed[k][r] != want[r][k - 1]:
                break
            if positions[k][r] != last + 1:
                broke("no gaps in positions",
                      f"{shown}: forward pass {k} fed row {r}'s token {fed[k][r]} at position {positions[k][r]}, but "
                      f"the row's previous real token sat at position {last}: it belongs at {last + 1} (the row has "
                      f"{n} prompt tokens and {k - 1} generated ones before it; padding takes no position)")
            last = positions[k][r]


@check("static_generate", forbidden=lambda: (_course_lib_batching().static_generate,))
def check_static_generate(impl, seed, allow_reference):
    for model, label, prompts, max_tokens, eos, want in _static_cases(seed):
        shown, rows, passes, _, _ = _run_static("static_generate", impl, model, label, prompts, max_tokens, eos,
                                                allow_reference)
        _expect_tokens(shown, prompts, rows, want, eos)
        B, L = len(prompts), max(len(p) for p in prompts)
        for k, tokens in enumerate(passes[:max(len(w) for w in want)]):
            if tokens != B * (L + k):
                unfinished = sum(len(w) > k for w in want)  # rows that still needed a token at pass k
                rule = "the whole rectangle"
                if tokens == B and k > 0:
                    why = ("it fed one token per row: that is a KV cache, the NEXT exercise. This one is the "
                           "no-cache baseline: every step runs the whole rectangle again (padded_forward)")
                elif unfinished < B and tokens % unfinished == 0 and tokens // unfinished <= L + k:
                    rule = "finished rows stay"
                    why = (f"it looks like only the {unfinished} unfinished row(s) rode along: a static batch "
                           "carries EVERY row (finished ones as padding) in every pass")
                else:
                    why = "every pass carries all the rows, and the batch grows by one column per step"
                broke(rule, f"{shown}: forward pass {k} fed {tokens} tokens; without a cache it computes all {B} rows "
                            f"over the whole padded width {L} + {k} = {B} x {L + k} = {B * (L + k)} tokens; {why}.")
        _expect_pass_count(shown, passes, want, max_tokens, eos)


@check("static_generate_cached", forbidden=lambda: (_course_lib_batching().static_generate_cached,))
def check_static_generate_cached(impl, seed, allow_reference):
    for model, label, prompts, max_tokens, eos, want in _static_cases(seed):
        shown, rows, passes, fed, positions = _run_static("static_generate_cached", impl, model, label, prompts,
                                                          max_tokens, eos, allow_reference)
        B, L = len(prompts), max(len(p) for p in prompts)
        expect(passes, f"{shown} never ran the model (no forward pass fed any token)", rule="one prefill")
        if passes[0] != B * L:
            broke("one prefill", f"{shown}: the first forward pass fed {passes[0]} tokens; the prefill runs the whole "
                                 f"padded batch once: {B} rows x {L} columns (the longest prompt) = {B * L} tokens"
                                 + (", not one column at a time" if passes[0] == B else "") + ".")
        for k, tokens in enumerate(passes[1:], start=1):
            if tokens != B:
                if tokens == B * (L + k):
                    why = ("that is the whole rectangle again: the cache already holds every earlier column, "
                           "feed only the newest token of each row")
                elif tokens < B:
                    why = ("fewer than the rows: a static batch carries EVERY row, finished ones as padding, "
                           "until the whole batch is done")
                else:
                    why = "feed exactly one new token per row; the cache holds the rest"
                broke("one token per row", f"{shown}: forward pass {k} (a decode step) fed {tokens} tokens; expected "
                                           f"{B} (one new token for each of the {B} rows): {why}.")
        _expect_positions(shown, prompts, want, fed, positions)
        _expect_tokens(shown, prompts, rows, want, eos)
        _expect_pass_count(shown, passes, want, max_tokens, eos)
