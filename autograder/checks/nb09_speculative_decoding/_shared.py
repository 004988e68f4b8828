"""What both of notebook 09's checks use: the check's drafter, which drafts each request's true greedy
answer right for a chosen number of tokens, and the engine it runs in."""
from __future__ import annotations

import random

from autograder import fixtures
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.scheduler.request import FinishReason


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
