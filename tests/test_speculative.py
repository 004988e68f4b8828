"""Speculative decoding (course_lib/spec): the drafters, the rejection rule's distribution, the
scheduler's rollback and its pages, and what the engine refuses. Greedy parity with and without
drafts is in test_engine_parity.py (SPEC_CONFIGS) and test_engine_invariants.py."""
import random

import pytest
import torch
from scipy.stats import chisquare

import course_lib
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.model.config import ModelConfig
from course_lib.spec.ngram import NgramDrafter
from course_lib.spec.verify import target_tokens
from invariants import check_all_finished, check_engine_invariants

SCRIPTED = ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                       num_kv_heads=1, max_position_embeddings=128, eos_token_id=2)


class _Req:  # what a drafter reads of a request
    def __init__(self, rid, prompt, output=()):
        self.request_id, self.prompt_token_ids, self.output_token_ids = rid, list(prompt), list(output)


def test_ngram_proposes_what_followed_the_latest_longest_match():
    d = NgramDrafter(3)
    # ... 5 6 7 8 9 ... 5 6 7 -> the 3-gram "5 6 7" matched: propose 8 9 1
    (tokens, probs), = d.propose([_Req("a", [5, 6, 7, 8, 9, 1, 4, 5, 6, 7])], [10]).values()
    assert tokens == [8, 9, 1] and probs is None
    # the longest n-gram wins over a later shorter one: "1 2" last followed by 9, "2" last by 4
    (tokens, _), = d.propose([_Req("b", [1, 2, 9, 9, 2, 4, 1, 2])], [10]).values()
    assert tokens == [9, 9, 2]
    assert d.propose([_Req("c", [1, 2, 3, 4])], [10]) == {}, "no earlier occurrence: no guess"
    (tokens, _), = d.propose([_Req("a2", [5, 6, 7, 8, 9, 5, 6, 7])], [1]).values()
    assert tokens == [8], "never more drafts than the limit the scheduler gives"


def test_ngram_index_follows_the_output_as_it_grows():
    d, req = NgramDrafter(2), _Req("a", [4, 5, 6])
    assert d.propose([req], [5]) == {}
    req.output_token_ids += [4, 5]  # 4 5 6 4 5 -> "4 5" was followed by 6
    (tokens, _), = d.propose([req], [5]).values()
    assert tokens == [6, 4]
    d.forget(["a"])
    assert "a" not in d._index


def _chi2_pvalue(observed: dict, probs: torch.Tensor, n: int) -> float:
    """Goodness of fit of counts to `probs`, bins with an expected count under 5 pooled into one."""
    exp = probs.double() * n
    big = (exp >= 5).nonzero().flatten().tolist()
    obs = [observed.get(t, 0) for t in big]
    exp_big = [float(exp[t]) for t in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp_big)
    if rest_exp >= 5:
        obs.append(rest_obs)
        exp_big.append(rest_exp)
    else:
        assert rest_obs <= 3 * max(rest_exp, 1) + 10, f"too many draws outside the likely tokens: {rest_obs}"
        scale = sum(obs) / sum(exp_big)
        exp_big = [e * scale for e in exp_big]
    return float(chisquare(obs, exp_big).pvalue)


@pytest.mark.parametrize("drafter", ["certain guess", "draft distribution"])
def test_the_rejection_rule_emits_the_targets_distribution(drafter):
    """On a small vocabulary: whatever the drafts, the first emitted token follows p_0 and, after a kept
    first draft, the second follows p_1 (fixed seeds: the same draws every run)."""
    gen = torch.Generator().manual_seed(0)
    vocab, n = 6, 20_000
    logits = torch.randn(3, vocab, generator=gen) * 1.5
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(2, vocab, generator=gen), -1)
    params = SamplingParams(temperature=1.0)
    first, second, kept_first = {}, {}, 0
    for _ in range(n):
        if drafter == "certain guess":
            drafts, probs = [int(p[0].argmin()), 1], None  # an unlikely first guess: mostly rejected
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
            probs = q
        tokens = target_tokens(logits, drafts, probs, params, gen)
        first[tokens[0]] = first.get(tokens[0], 0) + 1
        if tokens[0] == drafts[0]:
            kept_first += 1
            second[tokens[1]] = second.get(tokens[1], 0) + 1
    assert _chi2_pvalue(first, p[0], n) > 1e-4, f"first token counts {first} do not follow p_0 = {p[0]}"
    assert kept_first > 200
    assert _chi2_pvalue(second, p[1], kept_first) > 1e-4, f"second token counts {second} do not follow p_1"


def test_a_rejected_draft_never_comes_back():
    logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(300):
        tokens = target_tokens(logits, [1], None, SamplingParams(temperature=1.0), gen)
        assert len(tokens) == 2
        # kept (token 1 at position 0) or replaced by one of the others, never "rejected then 1"
        assert tokens[0] in (0, 1, 2)


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_sampled_engine_output_follows_the_model_with_drafts(speculative):
    """The tiny model at temperature 1: the 2nd and 3rd tokens (the first drafted decode step) of 1,500
    requests against the model's exact marginals."""
    model, tok = course_lib.load_tiny(torch.float32)
    prompt = tok.encode_prompt("repeat: 3434")
    n = 1500
    engine = LLMEngine(model, EngineConfig(speculative=speculative, num_speculative_tokens=3, draft_layers=2,
                                           max_num_seqs=64, seed=5))
    outs = engine.generate([prompt] * n, SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True))
    assert engine.scheduler.num_draft_tokens > 0
    seconds, thirds = {}, {}
    for o in outs:
        seconds[o.token_ids[1]] = seconds.get(o.token_ids[1], 0) + 1
        thirds[o.token_ids[2]] = thirds.get(o.token_ids[2], 0) + 1
    V = model.config.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(model.dense_logits([prompt])[0][-1].double(), -1)
        seqs = [prompt + [a] for a in range(V)]
        p2_given = torch.stack([torch.softmax(x[-1].double(), -1) for x in model.dense_logits(seqs)])
        p2 = p1 @ p2_given
        likely = [(a, b) for a in range(V) for b in range(V) if p1[a] * p2_given[a, b] > 1e-5]
        seqs3 = [prompt + [a, b] for a, b in likely]
        p3 = torch.zeros(V, dtype=torch.float64)
        for (a, b), x in zip(likely, model.dense_logits(seqs3)):
            p3 += p1[a] * p2_given[a, b] * torch.softmax(x[-1].double(), -1)
    assert _chi2_pvalue(seconds, p2, n) > 1e-4, f"2nd tokens {seconds} vs {p2}"
    assert _chi2_pvalue(thirds, p3 / p3.sum(), n) > 1e-4, f"3rd tokens {thirds}"


@pytest.mark.parametrize("rate", [0.0, 1.0, 0.5])
def test_rollback_moves_progress_to_the_kept_tokens_and_frees_rejected_pages(rate):
    engine = LLMEngine(SCRIPTED, EngineConfig(page_size=2, num_pages=60, speculative="ngram",
                                              num_speculative_tokens=4, spec_acceptance_rate=rate))
    rng = random.Random(3)
    for i in range(6):
        engine.add_request([7, 8, 7, 8, 7] + [rng.randrange(3, 40) for _ in range(rng.randint(1, 9))],
                           SamplingParams(max_tokens=30), scripted_output_len=rng.randint(5, 30))
    lengths = {}
    while engine.has_unfinished_requests:
        before = {rid: r.num_output_tokens for rid, r in engine.requests.items()}
        engine.step()
        stats = engine.step_stats[-1]
        check_engine_invariants(engine)
        for r in engine.scheduler.running:
            assert r.num_computed_tokens == r.num_tokens - 1 or r.num_computed_tokens < r.num_prompt_tokens
            # pages: exactly those its computed tokens (plus, mid-prefill, its chunk) need
            held = len(engine.kv.tables[r.request_id].pages)
            assert held == -(-max(r.num_computed_tokens, 1) // 2), (r.request_id, held, r.num_computed_tokens)
            lengths.setdefault(r.request_id, []).append(r.num_output_tokens - before.get(r.request_id, 0))
        if rate == 0.0:
            assert stats.num_accepted_tokens == 0
    check_all_finished(engine)
    sched = engine.scheduler
    assert sched.num_draft_tokens > 0
    assert sched.num_accepted_tokens == sum(s.num_accepted_tokens for s in engine.step_stats)
    if rate == 0.0:
        assert max(max(v) for v in lengths.values()) == 1, "nothing kept: one token per step"
    if rate == 1.0:  # (a draft past a request's scripted end is rejected: EOS comes there)
        assert sched.num_accepted_tokens > 0.7 * sched.num_draft_tokens
        assert max(max(v) for v in lengths.values()) == 5, "everything kept: 4 drafts and the target's own"
    for r in engine.requests.values():  # scripted lengths are kept exactly, drafts or not
        assert r.finish_reason.value == "eos" or r.num_output_tokens == 30


def test_drafts_count_against_the_token_budget():
    engine = LLMEngine(SCRIPTED, EngineConfig(max_num_batched_tokens=6, speculative="ngram",
                                              num_speculative_tokens=5, spec_acceptance_rate=0.0))
    for _ in range(3):
        engine.add_request([5, 6, 5, 6, 5, 6], SamplingParams(max_tokens=20), scripted_output_len=20)
    while engine.has_unfinished_requests:
        engine.step()
        s = engine.step_stats[-1]
        assert s.num_prefill_tokens + s.num_decode_tokens <= 6
    assert engine.scheduler.num_draft_tokens > 0


def test_only_the_continuous_scheduler_and_a_verifying_runner_speculate():
    with pytest.raises(ValueError, match="ContinuousScheduler's schedule"):
        LLMEngine(SCRIPTED, EngineConfig(scheduler="static", speculative="ngram"))

    class Runner:
        def execute(self, out):
            return {}

    with pytest.raises(ValueError, match="returns the target's token at every drafted position"):
        LLMEngine(SCRIPTED, EngineConfig(speculative="ngram"), runner=Runner())
    with pytest.raises(ValueError, match="needs a model"):
        LLMEngine(SCRIPTED, EngineConfig(speculative="draft"))
    with pytest.raises(ValueError, match="speculative must be 'none', 'ngram' or 'draft', got 'eagle'"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1, got 0"):
        EngineConfig(speculative="ngram", num_speculative_tokens=0)


def test_requests_with_logprobs_or_penalties_decode_without_drafts():
    model, tok = course_lib.load_tiny(torch.float64)
    prompt = tok.encode_prompt("repeat: 1212")
    engine = LLMEngine(model, EngineConfig(speculative="ngram"))
    plain = LLMEngine(model, EngineConfig())
    for params in (SamplingParams(max_tokens=8, logprobs=2), SamplingParams(max_tokens=8, repetition_penalty=1.3)):
        got, want = engine.generate([prompt], params)[0], plain.generate([prompt], params)[0]
        assert got.token_ids == want.token_ids
    assert engine.scheduler.num_draft_tokens == 0


def test_an_injected_verify_decides_every_drafted_row_and_positions_are_counted():
    model, tok = course_lib.load_tiny(torch.float64)
    prompt = tok.encode_prompt("repeat: 5656")
    calls = []

    def reject_all(logits, drafts, draft_probs, params, generator):
        calls.append(len(drafts))
        tokens = logits.argmax(-1).tolist()
        tokens[0] = tokens[0] if tokens[0] != drafts[0] else int(logits[0].argsort()[-2])  # never the draft
        return tokens

    engine = LLMEngine(model, EngineConfig(speculative="ngram", num_speculative_tokens=2), verify=reject_all)
    engine.generate([prompt], SamplingParams(max_tokens=6))
    assert calls and engine.scheduler.num_accepted_tokens == 0
    assert engine.scheduler.accepted_per_position == [0, 0][: len(engine.scheduler.accepted_per_position)]
    honest = LLMEngine(model, EngineConfig(speculative="ngram", num_speculative_tokens=2))
    honest.generate([prompt], SamplingParams(max_tokens=12))
    per_pos = honest.scheduler.accepted_per_position
    assert sum(per_pos) == honest.scheduler.num_accepted_tokens and per_pos == sorted(per_pos, reverse=True)


def test_drafts_never_push_a_plain_decode_out_of_the_step():
    """With a budget just above the number of running requests, every running request in decode is
    scheduled each step: the guesses get only what is left."""
    engine = LLMEngine(SCRIPTED, EngineConfig(max_num_batched_tokens=5, max_num_seqs=4, speculative="ngram",
                                              num_speculative_tokens=4, spec_acceptance_rate=1.0))
    for _ in range(4):
        engine.add_request([5, 6, 5, 6], SamplingParams(max_tokens=12), scripted_output_len=12)
    sched, left_out = engine.scheduler, 0
    while engine.has_unfinished_requests:
        decoding = {r.request_id for r in sched.running if r.num_tokens == r.num_computed_tokens + 1}
        out = sched.next_step()
        left_out += len(decoding - {s.request_id for s in out.scheduled})
        sampled = engine.runner.execute(out)
        engine._record(out, sampled, sched.update(out, sampled), 0.0)
    assert sched.num_draft_tokens > 0
    assert left_out == 0, f"running decodes left out of a step {left_out} times while others drafted"


def test_a_draft_models_work_is_counted_in_each_step_and_priced_by_the_simulated_clock():
    """StepStats carries the draft model's own passes (k rows per drafted request, one after another,
    through draft_layers of the target's layers), the simulated clock adds their price, and an n-gram
    drafter's steps carry none."""
    from course_lib.sim.clock import SimulatedClock

    model, tok = course_lib.load_tiny(torch.float32)
    prompt = tok.encode_prompt("repeat: 3434")
    runs = {}
    for speculative in ("ngram", "draft"):
        engine = LLMEngine(model, EngineConfig(speculative=speculative, num_speculative_tokens=3, draft_layers=1,
                                               max_num_seqs=4, seed=0), clock=SimulatedClock())
        costs = []
        for _ in range(6):
            engine.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
        while engine.has_unfinished_requests:
            engine.step()
            costs.append(engine.clock.last_cost)
        runs[speculative] = (engine.step_stats, costs, engine.scheduler.num_drafts)
    stats, costs, _ = runs["ngram"]
    assert all(s.draft_model_rows == s.draft_model_passes == 0 and c.draft_s == 0 for s, c in zip(stats, costs))
    stats, costs, num_drafts = runs["draft"]
    fraction = 1 / model.config.num_layers
    drafted = [(s, c) for s, c in zip(stats, costs) if s.num_draft_tokens]
    assert drafted, "the draft model drafted nothing"
    for s, c in zip(stats, costs):
        # a row per guess but the last, and at least the target's latest token per drafted request
        assert s.draft_model_rows >= s.num_draft_tokens and (c.draft_s > 0) == (s.num_draft_tokens > 0)
        if s.num_draft_tokens:
            assert s.draft_layer_fraction == fraction and 1 <= s.draft_model_passes <= 3
            assert s.draft_model_context_tokens > s.draft_model_rows  # each row attends to its context
    # The draft model's cache: after a request's first drafted step (its whole sequence so far), a step
    # computes at most k + 1 rows per request (the guesses but the last, the target's token, and the
    # last guess when the target kept all of them), never the sequence again.
    most = sum(s.num_draft_tokens for s in stats) + num_drafts + 6 * (len(prompt) + 1 - 2)
    assert sum(s.draft_model_rows for s in stats) <= most


def _dense_draft_logits(model, layers: int, seq: list[int]) -> torch.Tensor:
    """What the draft model says after `seq`, computed the long way: its layers over the whole sequence."""
    from course_lib.model.rope import rope_cos_sin
    from course_lib.model.transformer import DenseCausalAttention

    x = model.embed_tokens(torch.tensor(seq))
    cos, sin = rope_cos_sin(torch.arange(len(seq)), model.inv_freq, x.dtype)
    attend = DenseCausalAttention([len(seq)])
    for layer in model.layers[:layers]:
        x = layer.forward(x, cos, sin, attend)
    return model.lm_head(model.norm(x[-1:]))[0]


class _SampledReq(_Req):
    def __init__(self, rid, prompt, output=()):
        super().__init__(rid, prompt, output)
        self.sampling_params = SamplingParams(temperature=1.0, seed=3)


def test_the_draft_models_cache_gives_the_logits_of_rerunning_the_whole_sequence():
    """float64: every guess's distribution from the cached draft model equals the draft layers run over the
    whole sequence, through steps where the target keeps none, some or all of the guesses, a step with
    nothing new (its drafted entry was not scheduled), an output rolled back below the cache, and two
    requests in one batch."""
    from conftest import random_model
    from course_lib.sampler import target_probs
    from course_lib.spec.draft_model import DraftModelDrafter

    model = random_model(0, num_layers=3)
    drafter = DraftModelDrafter(model, num_speculative_tokens=3, num_layers=2)
    a, b = _SampledReq("a", [5, 9, 12, 7, 30, 8, 4]), _SampledReq("b", [11, 3])
    rng = random.Random(0)

    def propose_and_compare(requests):
        out = drafter.propose(requests, [3] * len(requests))
        for r in requests:
            drafts, q = out[r.request_id]
            seq = r.prompt_token_ids + r.output_token_ids
            for j, guess in enumerate(drafts):
                want = target_probs(_dense_draft_logits(model, 2, seq + drafts[:j])[None], r.sampling_params)[0]
                torch.testing.assert_close(q[j], want, rtol=0, atol=1e-6)  # float64 logits, float32 probabilities
        return out

    out = propose_and_compare([a, b])
    for kept in (1, 3, 0):  # the target keeps `kept` guesses of a's, then adds its own token
        a.output_token_ids += out["a"][0][:kept] + [rng.randrange(3, 61)]
        b.output_token_ids += [rng.randrange(3, 61)]
        out = propose_and_compare([a, b])
    out = propose_and_compare([a])  # nothing new: a's last drafted entry was not scheduled
    # the first guess rejected, then two more tokens before a's next drafted step (steps without drafts)
    a.output_token_ids += [(out["a"][0][0] + 1) % 61, out["a"][0][1], rng.randrange(3, 61)]
    out = propose_and_compare([a, b])
    a.output_token_ids = a.output_token_ids[:2]  # rolled back below what the cache holds
    propose_and_compare([a, b])
    # another answer after the same first tokens, longer than the cache: it must not be trusted
    a.output_token_ids = a.output_token_ids[:1] + [(t + 1) % 61 for t in a.output_token_ids[1:]] + [7] * 12
    propose_and_compare([a, b])
    assert drafter.caches["a"].tokens == a.prompt_token_ids + a.output_token_ids
    drafter.forget(["a", "b"])
    assert not drafter.caches
