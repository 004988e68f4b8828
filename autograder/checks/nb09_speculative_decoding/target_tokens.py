"""Notebook 09, `target_tokens`: greedy rows on crafted logits, greedy parity through the engine, and
the sampled rule by statistics under a fixed seed."""
from __future__ import annotations

import math
import random

import torch

from autograder import fixtures
from autograder._checking import broke, call, check, drive, expect, forbid_calls, kind_of, plain_int, show
from course_lib import EngineConfig, LLMEngine, SamplingParams

from ._shared import _RUNS, _build_engine, _Workload

TARGET = "target_tokens"


def _verify_function():
    from course_lib.spec.verify import target_tokens

    return (target_tokens,)


def _verify_module():
    import course_lib.spec.verify as verify

    return [verify]


# The statistics: a rate or a probability is off when it misses by more than Z standard deviations.
Z = 6.0


TRIALS = 1500  # calls per sampled case (the global generator seeded by the check: the same verdict every time)


def _tokens(shown, got, k: int, vocab: int) -> list[int]:
    """The student's result as 1 + k plain ints of the vocabulary, or a failure."""
    expect(type(got) in (list, tuple), lambda: f"{shown} must return a list of {k + 1} token ids, got {kind_of(got)} "
                                               f"{show(got)}", rule="one token per position")
    expect(len(got) == k + 1, lambda: f"{shown} returned {len(got)} token(s) {show(got)}; it must return one per position "
                                      f"of the row: {k + 1} (the request's last token and its {k} drafts), even past the "
                                      "first rejection (those positions are never read)", rule="one token per position")
    out = []
    for i, t in enumerate(got):
        v = plain_int(t)
        expect(v is not None and 0 <= v < vocab,
               lambda: f"{shown}: position {i} holds {show(t)}, not a token id in [0, {vocab})", rule="one token per position")
        out.append(v)
    return out


def _greedy_cases(rng: random.Random):
    """(logits, drafts, what the positions up to the first rejection must hold) on a 61-token vocabulary."""
    cases = []
    for k, pattern in [(1, "right"), (1, "wrong"), (3, "right"), (3, "first"), (3, "middle"), (4, "last"),
                       (5, "middle"), (2, "right")]:
        logits = torch.randn(k + 1, 61, dtype=torch.float64, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
        best = logits.argmax(dim=-1).tolist()
        bad = {"right": k, "wrong": 0, "first": 0, "middle": k // 2, "last": k - 1}[pattern]
        drafts = [best[i] if i < bad else (best[i] + 1 + rng.randrange(59)) % 61 for i in range(k)]
        cases.append((logits, tuple(drafts), best[: bad + 1]))
    return cases


# The sampled cases: each row's probabilities as templates, the tokens permuted by the seed.
V = 5


# A draft model's guesses (q given), temperature 1: position 0 keeps its draft with probability 0.30 / 0.60 = 0.5,
# else draws from max(0, p - q) = {0.25, 0.10} renormalised; position 1's draft is likelier under p than under q
# (always kept; were it rejected, the residual would hold one token, 0.05); position 2 is the bonus, drawn from p.
_P_MODEL = [[0.40, 0.30, 0.15, 0.10, 0.05], [0.35, 0.25, 0.20, 0.15, 0.05], [0.10, 0.20, 0.30, 0.35, 0.05]]


_Q_MODEL = [[0.15, 0.60, 0.05, 0.15, 0.05], [0.20, 0.20, 0.30, 0.20, 0.10]]


_DRAFT_MODEL = [1, 0]  # the template index of each position's draft


# Certain guesses (q None) at temperature 0.5 and top-k 3: the logits are log(b); p is b^2 over the top 3,
# renormalised. Position 0 drafts the likeliest token (p = 0.468, raw softmax 0.30); position 1 drafts a
# token outside the top 3 (p = 0: never kept).
_B_CERTAIN = [[0.30, 0.25, 0.20, 0.15, 0.10], [0.35, 0.30, 0.20, 0.10, 0.05], [0.40, 0.30, 0.15, 0.10, 0.05]]


_DRAFT_CERTAIN = [0, 3]


def _sampled_cases(seed: int):
    """(label, logits [3, V], drafts, draft_probs or None, params, p [3, V] as the rule defines it)."""
    rng = random.Random(seed * 13 + 5)
    cases = []
    perms = [rng.sample(range(V), V) for _ in range(3)]

    def place(template, perm):
        row = [0.0] * V
        for value, token in zip(template, perm):
            row[token] = value
        return row

    p = torch.tensor([place(t, perm) for t, perm in zip(_P_MODEL, perms)], dtype=torch.float64)
    q = torch.tensor([place(t, perm) for t, perm in zip(_Q_MODEL, perms)], dtype=torch.float32)
    shift = rng.uniform(-2.0, 2.0)
    drafts = tuple(perms[i][j] for i, j in enumerate(_DRAFT_MODEL))
    cases.append(("a draft model's guesses (draft_probs given), temperature 1", p.log() + shift, drafts, q,
                  SamplingParams(temperature=1.0, seed=seed), p))
    perms = [rng.sample(range(V), V) for _ in range(3)]
    b = torch.tensor([place(t, perm) for t, perm in zip(_B_CERTAIN, perms)], dtype=torch.float64)
    top = b.pow(2) * (b >= b.sort(dim=-1, descending=True).values[:, 2:3])
    p = top / top.sum(dim=-1, keepdim=True)
    drafts = tuple(perms[i][j] for i, j in enumerate(_DRAFT_CERTAIN))
    cases.append(("certain guesses (draft_probs None), temperature 0.5, top-k 3", b.log() + shift, drafts, None,
                  SamplingParams(temperature=0.5, top_k=3, seed=seed), p))
    return cases


def _off(count: int, n: int, prob: float) -> bool:
    """Is `count` successes in `n` trials off from probability `prob` (beyond Z deviations; exact at 0 and 1)?"""
    if prob <= 0.0:
        return count != 0
    if prob >= 1.0:
        return count != n
    return abs(count / n - prob) > Z * math.sqrt(prob * (1.0 - prob) / n)


def _fmt(row) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in row) + "]"


def _distribution(shown, draws: list[int], want, rule: str, what: str) -> None:
    n = len(draws)
    if n == 0:
        return
    counts = [draws.count(t) for t in range(V)]
    for t in range(V):
        if _off(counts[t], n, float(want[t])):
            broke(rule, f"{shown}: {what}: over {n} draws, token {t} came {counts[t]} time(s) ({counts[t] / n:.3f}); the "
                        f"rule's probabilities are {_fmt(want)} per token, the draws' frequencies "
                        f"{_fmt([c / n for c in counts])}")


def _sampled_statistics(impl, label, logits, drafts, q, params, p) -> None:
    k = len(drafts)
    shown = (f"target_tokens on {TRIALS} calls with {label}: drafts {list(drafts)}, p (the request's distribution at "
             f"each position) {[_fmt(r) for r in p.tolist()]}"
             + (f", q {[_fmt(r) for r in q.tolist()]}" if q is not None else ""))
    results = []
    for _ in range(TRIALS):
        got = call("target_tokens(logits, drafts, draft_probs, params, None)", impl, logits.clone(), drafts,
                   None if q is None else q.clone(), params, None)
        results.append(_tokens("target_tokens (a sampled request)", got, k, V))
    reach = results  # the calls that reached position i (every draft before it kept)
    for i in range(k + 1):
        if not reach:
            break
        if i == k:
            _distribution(shown, [r[k] for r in reach], p[k].tolist(), "a bonus token when all agree",
                          f"the token after the last draft when all {k} drafts were kept")
            break
        d = drafts[i]
        q_d = 1.0 if q is None else float(q[i, d])
        keep = min(1.0, float(p[i, d]) / q_d)
        kept = [r for r in reach if r[i] == d]
        if _off(len(kept), len(reach), keep):
            raw = float(torch.softmax(logits[i].double(), dim=-1)[d])
            raw_keep = min(1.0, raw / q_d)
            # Kept as often as the raw softmax (no temperature, no top-k) would keep it: the p is the wrong one.
            # A rejected draft drawn again from p looks kept: kept with min(1, p/q) + (1 - min(1, p/q)) p(d).
            back = keep + (1.0 - keep) * float(p[i, d])
            if _off(round(raw_keep * len(reach)), len(reach), keep) and not _off(len(kept), len(reach), raw_keep):
                rule = "sample from the request's p"
            elif _off(round(back * len(reach)), len(reach), keep) and not _off(len(kept), len(reach), back):
                broke("resample from the residual",
                      f"{shown}: position {i}'s draft {d} came out {len(kept)} time(s) in {len(reach)} calls that reached "
                      f"it ({len(kept) / len(reach):.3f}): kept with probability {keep:.3f}, and drawn again after a "
                      f"rejection ({keep:.3f} + (1 - {keep:.3f}) x p(d) = {back:.3f}). A rejected draft must never come "
                      "back: draw the replacement from the residual max(0, p - q), renormalised, which is 0 at the draft")
            else:
                rule = "keep with probability min(1, p/q)"
            broke(rule, f"{shown}: position {i}'s draft {d} was kept {len(kept)} time(s) in {len(reach)} calls that reached "
                        f"it ({len(kept) / len(reach):.3f}); the rule keeps it with probability min(1, p(d) / q(d)) = "
                        f"min(1, {float(p[i, d]):.3f} / {q_d:.3f}) = {keep:.3f}" +
                        (" (a certain guess: q(d) = 1)" if q is None else "") +
                        (f" (p after temperature {params.temperature} and top-k {params.top_k}; the raw softmax of the "
                         f"logits gives {raw:.3f})" if rule == "sample from the request's p" else ""))
        rejected = [r[i] for r in reach if r[i] != d]
        if rejected:
            # The residual max(0, p - q) renormalised (a certain guess: q is all on the draft), never the draft.
            q_row = q[i].to(p.dtype) if q is not None else torch.nn.functional.one_hot(torch.tensor(d), V).to(p.dtype)
            residual = (p[i] - q_row).clamp(min=0.0)
            residual[d] = 0.0
            residual = residual / residual.sum()
            outside = [t for t in set(rejected) if float(p[i, t]) == 0.0 and t != d]
            if outside:
                broke("sample from the request's p",
                      f"{shown}: when position {i}'s draft {d} was rejected, the token drawn instead was {outside[0]}, "
                      f"which the request's p gives probability 0 (top-k {params.top_k}): p is the distribution after "
                      "temperature, top-k and top-p")
            _distribution(shown, rejected, residual.tolist(), "resample from the residual",
                          f"the token at position {i} when its draft {d} was rejected (the residual max(0, p - q), "
                          "renormalised)")
        reach = kept


@check(TARGET, forbidden=_verify_function)
def check_target_tokens(impl, seed, allow_reference):
    rng = random.Random(seed)
    greedy = SamplingParams(temperature=0.0)
    with forbid_calls(TARGET, _verify_module(), enabled=not allow_reference):
        # 1. Greedy rows on crafted logits.
        for logits, drafts, want in _greedy_cases(rng):
            k = len(drafts)
            shown = f"target_tokens(logits [{k + 1}, 61], drafts {list(drafts)}, None, a greedy request, None)"
            got = _tokens(shown, call(shown, impl, logits.clone(), drafts, None, greedy, None), k, 61)
            m = len(want)
            expect(got[:m] == want,
                   lambda: f"{shown} returned {got}; the target's argmax at each position is "
                           f"{logits.argmax(dim=-1).tolist()}, so positions 0..{m - 1} (up to the first draft that is not "
                           f"the argmax{', all of them' if m == k + 1 else ''}) must hold {want}",
                   rule="greedy: the target's argmax")

        # 2. Greedy parity through the engine: the student's function decides every drafted row.
        def verify(logits, drafts, draft_probs, params, generator):
            shown = f"target_tokens inside the engine (a drafted row of {len(drafts)} drafts, greedy={params.greedy})"
            return _tokens(shown, call(shown, impl, logits, tuple(drafts), draft_probs, params, None), len(drafts),
                           logits.shape[-1])

        spec = _RUNS["pages of 4, 4 drafts per step"]
        work = _Workload(seed, spec)
        engine = _build_engine(work, spec, seed, verify=verify)
        who = "serving a float64 model with your target_tokens as the engine's verify (greedy requests)"
        drive(engine, who, max_steps=300)
        for rid, (want, _) in work.expected.items():
            got = engine.requests[rid].output_token_ids
            expect(got == want, lambda: f"{who}: request {rid} produced {got}, decoding without drafts gives {want}",
                   rule="greedy: the target's argmax")

        # 3. The sampled rule, by statistics (the global generator seeded here: the same verdict every run).
        torch.manual_seed(seed * 7919 + 17)
        for label, logits, drafts, q, params, p in _sampled_cases(seed):
            _sampled_statistics(impl, label, logits, drafts, q, params, p)

        # 4. Sampled requests through the engine with a real drafter (the model's first layer): every row answered.
        model = fixtures.random_model(seed)
        engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=48, speculative="draft", draft_layers=1,
                                               num_speculative_tokens=3, seed=seed), verify=verify)
        prompts = fixtures.random_prompts(rng, 3, model.config.vocab_size, lo=3, hi=8)
        for i, prompt in enumerate(prompts):
            engine.add_request(prompt, SamplingParams(temperature=0.8, top_k=20, max_tokens=10, seed=seed + i),
                               request_id=f"s{i}")
        drive(engine, "serving sampled requests (temperature 0.8, top-k 20) with a draft model's guesses through your "
                      "target_tokens", max_steps=300)
        drafted = engine.scheduler.num_draft_tokens
        expect(drafted > 0, "target_tokens (internal): the sampled run drafted nothing")
        for i in range(3):
            n = len(engine.requests[f"s{i}"].output_token_ids)
            expect(n == 10, f"serving sampled requests through your target_tokens: request s{i} produced {n} tokens, "
                            "expected 10", rule="one token per position")
