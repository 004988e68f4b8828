"""What several of notebook 01's checks use: course_lib's module to refuse, the "bad input" and
"inputs unchanged" rules, and the static loops' cases and pass counter (shared by both loops)."""
from __future__ import annotations

import contextlib
import random
import sys

from autograder import fixtures
from autograder._checking import (broke, call, expect, expect_unchanged, forbid_calls, is_tensor, kind_of, plain_int,
                                  pristine, show)


def _course_lib_batching():
    import course_lib.static_batching as module

    return module


# What a static loop may call in course_lib's module: `pad_batch`, section 2's exercise (graded by its own
# check), which the notebook hands to later cells as `pad_fn` while the student's fails, and which computes no
# part of a loop's answer. The rest of the module stays watched: the loops and their row bookkeeping
# (`_Rows`). By name: the trip wires judge each function by its own code (autograder.call_tripwire).
LOOP_HELPERS = ("course_lib.static_batching:pad_batch",)


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
            forbid_calls(name, [_course_lib_batching()], enabled=not allow_reference, allowed=LOOP_HELPERS):
        got = call(shown, impl, model, given, max_tokens, eos)
    expect(not forged, f"{shown} called the check's counter of forward passes (a hook on the model's embedding) "
                       "itself: run the model, the check counts its passes")
    expect_unchanged(shown, "prompts", given, prompts, rule="inputs unchanged")
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
