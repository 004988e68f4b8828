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

import contextlib
import itertools
import math
import random

import torch

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.scheduler.request import FinishReason

from .. import fixtures
from .._checking import (REFERENCE_MESSAGE, broke, call, check, drive, expect, fail, forbid_calls, kind_of,
                         plain_int, show)

TARGET = "target_tokens"
ROLLBACK = "StudentRollback"


def _verify_function():
    from course_lib.spec.verify import target_tokens

    return (target_tokens,)


def _verify_module():
    import course_lib.spec.verify as verify

    return [verify]


# ---------------------------------------------------------------------------------------------
# The check's drafter: drafts each request's true greedy answer, right for a chosen number of tokens
# ---------------------------------------------------------------------------------------------


class ScriptedDrafter:
    """Knows every request's greedy answer (without stops) and where it stops. Each drafted step of a
    request takes the next count `right` from a cycle over 0..k (shuffled by the seed): the first
    `right` drafts are the answer's next tokens, the rest wrong ones. When the request's stop is among
    its next drafts, all drafts are right (the stop then falls inside kept drafts, something after it
    is dropped); when the stop would be the token after the last draft, one draft fewer is right (the
    next step then drafts across it). Every fourth turn of a request it drafts nothing (a plain decode
    in the same batch). Installed as `engine.scheduler.drafter` (the engine's own drafter protocol)."""

    kind = "check"

    def __init__(self, answers: dict, stops: dict, k: int, vocab: int, seed: int):
        self.answers, self.stops, self.k, self.vocab = answers, stops, k, vocab
        rng = random.Random(seed * 7 + 3)
        self.cycle = list(range(k + 1))
        rng.shuffle(self.cycle)
        self.turns: dict[str, int] = {}  # request id -> steps it was asked for drafts
        self.drafted: dict[str, int] = {}  # request id -> where it is in the cycle
        self.log: list[tuple] = []  # (request id, output length, number of drafts, how many right)

    def propose(self, requests, limits) -> dict:
        drafted = {}
        for request, limit in zip(requests, limits):
            rid = request.request_id
            answer = self.answers.get(rid)
            if answer is None:
                continue
            turn = self.turns[rid] = self.turns.get(rid, 0) + 1
            n = min(limit, self.k)
            if n <= 0 or turn % 4 == 0:
                continue
            drafted_turn = self.drafted[rid] = self.drafted.get(rid, len(self.drafted)) + 1  # (each request its own start)
            done = len(request.output_token_ids)
            truth = answer[done: done + n]
            n = len(truth)
            if n == 0:
                continue
            end = self.stops.get(rid)
            if end is not None and done <= end < done + n:
                right = n
            elif end is not None and end == done + n:
                right = n - 1
            else:
                right = min(self.cycle[drafted_turn % len(self.cycle)], n)
            guess = list(truth[:right]) + [(t + 1 + (i % 3)) % self.vocab for i, t in enumerate(truth[right:])]
            drafted[rid] = (guess, None)
            self.log.append((rid, done, n, right))
        return drafted

    def forget(self, request_ids) -> None:
        pass


def _stop_of(token: int, num_output: int, params, eos, prompt_len: int, max_len: int):
    """Why `token`, just appended as the `num_output`-th output token, ends its request (the engine's rule)."""
    if token in params.stop_token_ids:
        return FinishReason.STOP
    if token in eos and not params.ignore_eos:
        return FinishReason.EOS
    if num_output >= params.max_tokens or prompt_len + num_output >= max_len:
        return FinishReason.LENGTH
    return None


def expected_answer(answer: list[int], params, eos, prompt_len: int, max_len: int):
    """(tokens, reason, index of the last token): `answer` (greedy, no stop) cut at its first stop."""
    for i, token in enumerate(answer):
        reason = _stop_of(token, i + 1, params, eos, prompt_len, max_len)
        if reason is not None:
            return answer[: i + 1], reason, i
    raise RuntimeError("internal: the greedy answer is shorter than the request can run")


def accept_rule(before: list[int], drafts, targets, params, eos, prompt_len: int, max_len: int):
    """The check's own rollback rule: (tokens appended, finish reason or None)."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == targets[kept]:
        kept += 1
    appended = []
    for token in targets[: kept + 1]:
        appended.append(token)
        reason = _stop_of(token, len(before) + len(appended), params, eos, prompt_len, max_len)
        if reason is not None:
            return appended, reason
    return appended, None


# The workloads: each request (prompt length, max_tokens, ignore_eos, stop: None / "token" / "eos"); the second
# run's model has 512 tokens, so that token ids above 256 (not interned by Python: equal ids, different objects)
# are drafted and kept.
_RUNS = {
    "pages of 4, 4 drafts per step": dict(
        page_size=4, k=4, num_pages=64, budget=64, prefix_caching=False, max_model_len=40, shared=0,
        requests=[(5, 22, True, None), (4, 20, True, "token"), (6, 20, False, "eos"), (6, 22, True, None),
                  (3, 9, True, None), (28, 20, True, None)]),
    "pages of 2, 3 drafts, prefix caching, a 10-token budget, a pool small enough to preempt": dict(
        page_size=2, k=3, num_pages=20, budget=10, prefix_caching=True, max_model_len=48, shared=6, vocab=512,
        requests=[(3, 16, True, "token"), (2, 14, True, None), (4, 14, False, "eos"), (3, 15, True, None),
                  (2, 12, True, "token")]),
}


class _Workload:
    """The requests of one run, their greedy answers without stops, and where each must stop."""

    def __init__(self, seed: int, spec: dict):
        rng = random.Random(seed * 1000 + spec["page_size"] * 31 + spec["k"])
        shape = {"vocab_size": spec["vocab"]} if "vocab" in spec else {}
        base = fixtures.random_model(seed, **shape)
        vocab = base.config.vocab_size
        longest = max(m for _, m, *_ in spec["requests"])
        # Prompts whose answers have what the run needs (a random model's greedy answer can fall into a short
        # cycle): the "eos" request a token first seen at 3..8 (made the model's EOS: that request stops there,
        # the others ignore it), each "token" request a token first seen at 4..9 (its stop token).
        for _attempt in range(50):
            shared = fixtures.random_prompts(rng, 1, vocab, lo=spec["shared"], hi=spec["shared"])[0] \
                if spec["shared"] else []
            prompts = [shared + fixtures.random_prompts(rng, 1, vocab, lo=n, hi=n)[0] for n, *_ in spec["requests"]]
            raw = fixtures.greedy(base, prompts, longest)
            picks = {}
            for i, (_, _, _, stop) in enumerate(spec["requests"]):
                if stop is not None:
                    lo, hi = (3, 9) if stop == "eos" else (4, 10)
                    picks[i] = next((j for j in range(lo, hi) if raw[i][j] not in raw[i][:j]), None)
            eos_index = next(i for i, r in enumerate(spec["requests"]) if r[3] == "eos")
            if None in picks.values():
                continue
            eos = raw[eos_index][picks[eos_index]]
            if all(raw[i][picks[i]] != eos for i in picks if i != eos_index):
                break
        else:
            raise RuntimeError("internal: no prompts whose answers have the stops the run needs")
        self.prompts, self.eos, self.vocab = prompts, eos, vocab
        self.model = fixtures.random_model(seed, eos_token_id=eos, **shape)  # the same weights, with that EOS
        self.params, self.answers, self.expected, self.stops = [], {}, {}, {}
        max_len = spec["max_model_len"]
        for i, (_, max_tokens, ignore_eos, stop) in enumerate(spec["requests"]):
            rid = f"r{i}"
            stop_ids = [raw[i][picks[i]]] if stop == "token" else []
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_ids)
            self.params.append(params)
            self.answers[rid] = raw[i]
            tokens, reason, last = expected_answer(raw[i], params, {eos}, len(prompts[i]), max_len)
            self.expected[rid] = (tokens, reason)
            if reason is not FinishReason.LENGTH:
                self.stops[rid] = last


class _StepBook:
    """What the engine's runner did in each step (kept by the check, on the grader's side): every drafted
    row's request, start, drafts, the pages it held and its output before the update, and the target's
    tokens. `check_step` then holds every drafted request to the rule after the update."""

    def __init__(self, engine):
        self.engine = engine
        self.eos = frozenset(engine.model_config.eos_token_ids)  # the model's, as the check built it
        self.rows: list[tuple] = []
        self.freed_pages = 0
        self.stops_inside = 0
        self.kinds: set[int] = set()  # how many drafts were kept, over the whole run
        execute = engine.runner.execute

        def execute_and_note(out):
            rows = []
            for s in out.scheduled:
                if s.draft_token_ids:
                    r = engine.requests[s.request_id]
                    rows.append((s.request_id, s.start, tuple(s.draft_token_ids),
                                 list(engine.kv.tables[s.request_id].pages), list(r.output_token_ids)))
            sampled = execute(out)
            self.rows = [(rid, start, drafts, pages, before, [int(t) for t in sampled[rid]])
                         for rid, start, drafts, pages, before in rows]
            return sampled

        engine.runner.execute = execute_and_note

    def check_step(self, who: str, step: int) -> None:
        engine = self.engine
        kv, pool = engine.kv, engine.pool
        max_len = kv.max_model_len
        for rid, start, drafts, pages, before, targets in self.rows:
            r = engine.requests[rid]
            params = r.sampling_params
            want, reason = accept_rule(before, drafts, targets, params, self.eos, len(r.prompt_token_ids), max_len)
            kept = 0
            while kept < len(drafts) and drafts[kept] == targets[kept]:
                kept += 1
            self.kinds.add(kept)
            shown = (f"{who}, step {step}: request {rid} (output so far {len(before)} tokens, progress {start}) drafted "
                     f"{list(drafts)}, the target's tokens at its {len(targets)} positions were {targets}")
            got = r.output_token_ids[len(before):] if r.output_token_ids[: len(before)] == before else None
            if got is None:
                broke("the agreeing prefix", f"{shown}: its earlier output changed (it was {before[-6:]} at the end, now "
                      f"{r.output_token_ids[-6:]}): append to request.output_token_ids, never rewrite it")
            if got != want:
                if reason is not None and len(got) > len(want) and got[: len(want)] == want:
                    broke("stop where the answer stops",
                          f"{shown}: it appended {got}, but {want[-1]} ends the request ({_why(reason, params)}): append "
                          f"{want} and stop there, the tokens after a stop are never part of the answer")
                if len(got) < len(want) and got == want[: len(got)] and r.is_finished:
                    broke("stop where the answer stops",
                          f"{shown}: it appended {got} and the request finished ({show(r.finish_reason)}); expected "
                          f"{want}: {got[-1] if got else 'nothing'} ends nothing (stop tokens "
                          f"{list(params.stop_token_ids)}, EOS {sorted(self.eos)}, ignore_eos={params.ignore_eos}, "
                          f"max_tokens {params.max_tokens}, max_model_len {max_len})")
                broke("the agreeing prefix",
                      f"{shown}: it appended {got}, expected {want} ({kept} draft(s) agree with the target's tokens, so "
                      f"the output gains {'those and ' if kept else ''}the target's token at position {kept}"
                      + (f", cut at the stop {want[-1]}" if reason is not None else "") + ")")
            if reason is not None:
                expect(r.is_finished and r.finish_reason is reason,
                       lambda: f"{shown}: it appended {want}, and {want[-1]} ends the request ({_why(reason, params)}): "
                               f"accept_drafts must return {reason} (a FinishReason), got the request "
                               + (f"finished with {show(r.finish_reason)}" if r.is_finished else "still running"),
                       rule="stop where the answer stops")
                if len(want) < kept + 1:
                    self.stops_inside += 1
                continue
            expect(not r.is_finished, lambda: f"{shown}: it appended {want}, which ends nothing, but the request finished "
                                              f"({show(r.finish_reason)}): return None when no token stops it",
                   rule="stop where the answer stops")
            progress = start + len(want)
            expect(r.num_computed_tokens == progress,
                   lambda: f"{shown}: it appended {len(want)} token(s); its progress must be {start} + {len(want)} = "
                           f"{progress} (the K/V of its last token and of the {len(want) - 1} kept draft(s) is written; "
                           f"the rejected drafts' is not, and the newest token's is computed next step), got "
                           f"num_computed_tokens = {show(r.num_computed_tokens)}",
                   rule="progress counts kept tokens")
            table = kv.tables.get(rid)
            keep = kv.pages_to_hold(progress)
            held = list(table.pages) if table is not None else None
            expect(held == pages[:keep],
                   lambda: f"{shown}: the step held pages {pages} (page size {kv.page_size}); with progress {progress} "
                           f"it must keep {pages[:keep]} and give back {pages[keep:] or 'none'}, but its page table is "
                           f"{held}", rule="rejected pages go back")
            expect(kv.filled.get(rid) == progress,
                   lambda: f"{shown}: the KV manager counts {kv.filled.get(rid)} filled slots for it, not {progress}: give "
                           "the pages back through the manager (self.kv.truncate(request, num_tokens)), not the pool",
                   rule="rejected pages go back")
            for page in pages[keep:]:
                expect(pool.ref_counts[page] == 0 and pool.is_free(page),
                       lambda: f"{shown}: page {page} held only rejected drafts and must be free again, it has "
                               f"{pool.ref_counts[page]} owner(s)", rule="rejected pages go back")
            self.freed_pages += len(pages) - keep
        held = sum(1 for rc in pool.ref_counts if rc > 0)
        expect(held + pool.num_free_pages == pool.num_pages,
               f"{who}, step {step}: {held} pages held + {pool.num_free_pages} free != {pool.num_pages} in the pool: a "
               "page was lost or freed twice", rule="rejected pages go back")


def _why(reason, params) -> str:
    return {FinishReason.STOP: f"it is a stop token of the request, {list(params.stop_token_ids)}",
            FinishReason.EOS: "it is the model's EOS and the request does not ignore it",
            FinishReason.LENGTH: "the request reaches its length limit (max_tokens or max_model_len)"}.get(reason, str(reason))


def _build_engine(work: _Workload, spec: dict, seed: int, *, scheduler=None, verify=None):
    config = EngineConfig(page_size=spec["page_size"], num_pages=spec["num_pages"], max_num_seqs=8,
                          max_num_batched_tokens=spec["budget"], max_model_len=spec["max_model_len"],
                          enable_prefix_caching=spec["prefix_caching"], admission="none")
    engine = LLMEngine(work.model, config, scheduler=scheduler, verify=verify)
    # The check's drafter in the engine's drafter slot (the engine's own `speculative=` would also check
    # the scheduler's class, which through the grading membrane is a stand-in).
    engine.scheduler.drafter = ScriptedDrafter(work.answers, work.stops, spec["k"], work.vocab, seed)
    for i, (prompt, params) in enumerate(zip(work.prompts, work.params)):
        engine.add_request(prompt, params, request_id=f"r{i}")
    return engine


# ---------------------------------------------------------------------------------------------
# target_tokens
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# StudentRollback
# ---------------------------------------------------------------------------------------------


def _scheduler_classes():
    from course_lib.scheduler.base import SchedulerBase
    from course_lib.scheduler.continuous import ContinuousScheduler

    return ContinuousScheduler, SchedulerBase


@contextlib.contextmanager
def _reference_rollback_forbidden(enabled: bool):
    """While the block runs, course_lib's own accept_drafts fails if called (an override that delegates to
    it with super() hands in the reference)."""
    if not enabled:
        yield
        return
    base = _scheduler_classes()[1]
    saved = base.__dict__["accept_drafts"]

    def stub(self, *args, **kwargs):
        fail(f"{ROLLBACK} {REFERENCE_MESSAGE} (its accept_drafts calls course_lib's SchedulerBase.accept_drafts)")

    try:
        base.accept_drafts = stub
        yield
    finally:
        base.accept_drafts = saved


def _rollback_run(impl, seed, label, spec, allow):
    work = _Workload(seed, spec)
    engine = _build_engine(work, spec, seed, scheduler=impl)
    book = _StepBook(engine)
    who = f"{ROLLBACK} ({label})"
    with _reference_rollback_forbidden(not allow):
        steps = itertools.count()
        drive(engine, who, max_steps=300, on_step=lambda _engine: book.check_step(who, next(steps)))
    for rid, (want, reason) in work.expected.items():
        r = engine.requests[rid]
        expect(r.output_token_ids == want,
               lambda: f"{who}: request {rid} produced {r.output_token_ids}; decoding without drafts gives {want}",
               rule="the agreeing prefix")
        expect(r.finish_reason is reason, lambda: f"{who}: request {rid} finished with {show(r.finish_reason)}, "
                                                  f"expected {reason}", rule="stop where the answer stops")
    expect(engine.pool.num_free_pages == engine.pool.num_pages,
           f"{who}: after every request finished, {engine.pool.num_pages - engine.pool.num_free_pages} page(s) are still "
           "held", rule="rejected pages go back")
    drafter = engine.scheduler.drafter
    # The run must have shown every case the rules are about (the workloads are built so that it does).
    expect(len(drafter.log) > 0 and engine.scheduler.num_draft_tokens > 0,
           f"{who}: no drafted row was scheduled: keep ContinuousScheduler's schedule() (only accept_drafts is yours)")
    expect({0, spec["k"]} <= book.kinds and book.freed_pages > 0 and book.stops_inside > 0,
           f"{who} (internal): the run missed a case (kept counts {sorted(book.kinds)}, pages given back "
           f"{book.freed_pages}, stops inside drafts {book.stops_inside})")
    return engine


@check(ROLLBACK, allowed_bases=_scheduler_classes)
def check_StudentRollback(impl, seed, allow_reference):
    # Names, not issubclass: through the grading membrane the class is a stand-in whose attributes cross.
    bases = [k.__name__ for k in impl.__mro__] if isinstance(impl, type) else []
    expect("ContinuousScheduler" in bases,
           f"{ROLLBACK} must be a class built on ContinuousScheduler (class {ROLLBACK}(ContinuousScheduler)), got "
           f"{impl!r}")
    owner = getattr(getattr(impl, "accept_drafts", None), "__qualname__", "").split(".")[0]
    expect(owner not in ("", "ContinuousScheduler", "SchedulerBase"),
           f"{ROLLBACK} {REFERENCE_MESSAGE} (its accept_drafts is still course_lib's {owner}.accept_drafts: define your "
           "own in the class)")
    schedule_owner = getattr(getattr(impl, "schedule", None), "__qualname__", "").split(".")[0]
    expect(schedule_owner == "ContinuousScheduler",
           f"{ROLLBACK} must keep ContinuousScheduler's schedule() (it schedules the drafted rows); yours is "
           f"{schedule_owner}.schedule")
    for label, spec in _RUNS.items():
        _rollback_run(impl, seed, label, spec, allow_reference)
