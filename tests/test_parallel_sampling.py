"""Parallel sampling on shared pages (SamplingParams n / best_of): the samples of one prompt share its
pages by reference, the partly filled last page is copied on the first write that diverges, greedy
samples equal the plain model's greedy answer token for token (float64, CPU), seeded samples are each
reproducible (sample i draws with seed + i), best_of keeps the n of highest cumulative logprob, and
every page is back at the end: finished, aborted (before or after the fork) or preempted."""
from __future__ import annotations

import pytest
import torch

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.scheduler.continuous import ContinuousScheduler
from conftest import random_model, random_prompts
from invariants import check_all_finished, check_engine_invariants

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model():
    return random_model(5)


@pytest.fixture(scope="module")
def prompts(model):
    # lengths 1..40 with page_size 4 or 5: most prompts end inside a page (the page that is copied on write)
    return random_prompts(6, model.config.vocab_size, lo=1, hi=40, seed=11)


def distinct_used_slots(engine) -> int:
    """Slots holding a token's K/V, each physical page counted once: what used_slots must say."""
    fill = {}
    for rid, table in engine.kv.tables.items():
        filled = engine.kv.filled[rid]
        for i, page in enumerate(table.pages):
            fill[page] = max(fill.get(page, 0), min(engine.kv.page_size, filled - i * engine.kv.page_size))
    return sum(fill.values())


def run_checked(engine, prompts, params):
    """generate(), one step at a time, checking the pool's bookkeeping after every step."""
    ids = [engine.add_request(p, params) for p in prompts]
    shared_seen = 0
    while engine.has_unfinished_requests:
        engine.step()
        check_engine_invariants(engine)
        assert engine.kv.used_slots() == distinct_used_slots(engine)
        shared_seen = max(shared_seen, engine.stats()["kv_pages_saved_by_sharing"])
    return [engine.output(i) for i in ids], shared_seen


@pytest.mark.parametrize("forward", ["eager", "cpu"])
@pytest.mark.parametrize("page_size,chunked,small_pool,speculative", [
    (4, True, False, "none"), (5, False, False, "none"), (4, True, True, "none"), (1, True, False, "none"),
    # drafted decodes of forked samples: the first write into the shared last page copies it
    (4, True, False, "ngram"), (5, True, True, "draft")])
def test_greedy_samples_each_equal_the_plain_greedy_answer(model, prompts, forward, page_size, chunked, small_pool,
                                                           speculative):
    expected = [model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    config = EngineConfig(page_size=page_size, max_num_seqs=12, max_num_batched_tokens=24 if chunked else 256,
                          enable_chunked_prefill=chunked, admission="none", forward=forward,
                          num_pages=120 // page_size if small_pool else None, speculative=speculative)
    engine = LLMEngine(model, config)
    outputs, shared = run_checked(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=4))
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.finished and len(out.samples) == 4
        for k, sample in enumerate(out.samples):
            assert sample.token_ids == want, f"prompt {i} (len {len(prompts[i])}), sample {k} diverged"
            assert sample.index == k and sample.parent_id == out.request_id
    stats = engine.stats()
    assert stats["forked_pages"] > 0 and shared > 0, "the samples never shared a page"
    if page_size > 1:
        assert stats["copied_pages"] > 0, "no partly filled page was ever copied on write"
    if small_pool:
        assert stats["num_preemptions"] > 0, "the small pool was meant to force preemptions"
    check_all_finished(engine)


def test_the_samples_share_the_prompt_pages_and_copy_only_the_last(model):
    prompt = list(range(3, 14))  # 11 tokens, pages of 4: two full pages and one holding 3 tokens
    engine = LLMEngine(model, EngineConfig(page_size=4, max_num_seqs=8))
    group = engine.add_request(prompt, SamplingParams(max_tokens=3, n=4, ignore_eos=True))
    engine.step()  # the prompt, and every sample's first token
    tables = [engine.kv.tables[f"{group}#{i}"].pages for i in range(4)]
    assert all(t == tables[0] for t in tables) and len(tables[0]) == 3
    assert [engine.pool.ref_counts[p] for p in tables[0]] == [4, 4, 4]
    assert engine.pool.num_used_pages == 3 and engine.stats()["kv_pages_saved_by_sharing"] == 9
    engine.step()  # each sample writes its first token into the shared last page: 3 copies, one keeps it
    tables = [engine.kv.tables[f"{group}#{i}"].pages for i in range(4)]
    assert all(t[:2] == tables[0][:2] for t in tables), "full prompt pages stay shared"
    assert len({t[2] for t in tables}) == 4, "each sample writes into a last page of its own"
    assert engine.stats()["copied_pages"] == 3 and engine.pool.num_used_pages == 2 + 4
    while engine.has_unfinished_requests:
        engine.step()
    check_all_finished(engine)


def test_a_prompt_that_fills_its_last_page_needs_no_copy(model):
    engine = LLMEngine(model, EngineConfig(page_size=4))
    engine.generate([list(range(3, 11))], SamplingParams(max_tokens=6, n=3, ignore_eos=True))
    assert engine.stats()["forked_pages"] == 2 * 2 and engine.stats()["copied_pages"] == 0


def test_seeded_samples_are_each_reproducible(model, prompts):
    """Sample i draws from its own generator seeded seed + i: it equals n=1 with that seed, whatever runs beside it."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.5, seed=42, n=4, ignore_eos=True)
    engine = LLMEngine(model, EngineConfig(page_size=4))
    groups = engine.generate(prompts[:3], params)
    alone = [[LLMEngine(model, EngineConfig(page_size=4)).generate(
        [p], SamplingParams(max_tokens=MAX_TOKENS, temperature=1.5, seed=42 + i, ignore_eos=True))[0].token_ids
        for i in range(4)] for p in prompts[:3]]
    assert [[s.token_ids for s in g.samples] for g in groups] == alone
    assert any(len({tuple(ids) for ids in answers}) > 1 for answers in alone), "the samples should differ"
    again = LLMEngine(model, EngineConfig(page_size=5, max_num_batched_tokens=16)).generate(prompts[:3], params)
    assert [[s.token_ids for s in g.samples] for g in again] == alone


def test_best_of_keeps_the_n_most_likely_samples(model, prompts):
    params = SamplingParams(max_tokens=8, temperature=1.5, seed=3, n=2, best_of=5, ignore_eos=True)
    (out,) = LLMEngine(model, EngineConfig(page_size=4)).generate([prompts[1]], params)
    every = LLMEngine(model, EngineConfig(page_size=4)).generate(
        [prompts[1]], SamplingParams(max_tokens=8, temperature=1.5, seed=3, n=5, logprobs=0, ignore_eos=True))[0]
    ranked = sorted(every.samples, key=lambda s: -s.cumulative_logprob)[:2]
    assert [s.token_ids for s in out.samples] == [s.token_ids for s in ranked]
    assert [s.index for s in out.samples] == [0, 1]
    assert out.samples[0].cumulative_logprob >= out.samples[1].cumulative_logprob
    assert out.token_ids == out.samples[0].token_ids


@pytest.mark.parametrize("forward,tolerance", [("eager", 1e-9), ("cpu", 1e-5)])  # (the C step's float64 rounds apart)
def test_logprobs_are_the_models_raw_log_softmax(model, prompts, forward, tolerance):
    prompt = prompts[2]
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=0, logprobs=3, ignore_eos=True, n=2)
    (out,) = LLMEngine(model, EngineConfig(page_size=4, forward=forward)).generate([prompt], params)
    for sample in out.samples:
        ids = prompt + sample.token_ids
        (logits,) = model.dense_logits([ids])
        want = torch.log_softmax(logits, dim=-1)[len(prompt) - 1: len(ids) - 1]
        for k, (token, (lp, top)) in enumerate(zip(sample.token_ids, sample.logprobs)):
            assert lp == pytest.approx(want[k, token].item(), abs=tolerance)
            values, best = torch.topk(want[k], 3)
            assert [t for t, _ in top] == best.tolist()
            assert [v for _, v in top] == pytest.approx(values.tolist(), abs=tolerance)
        assert sample.cumulative_logprob == pytest.approx(sum(lp for lp, _ in sample.logprobs))


@pytest.mark.parametrize("when", [0, 1, 3])
def test_every_page_comes_back_after_an_abort(model, prompts, when):
    """Aborting the group before its prompt is done, at its fork, or later; and one sample alone."""
    engine = LLMEngine(model, EngineConfig(page_size=4, max_num_batched_tokens=8))
    params = SamplingParams(max_tokens=MAX_TOKENS, n=3, ignore_eos=True)
    gone = engine.add_request(prompts[0] + prompts[1], params)  # long: several chunks of 8
    kept = engine.add_request(prompts[2], params)
    for _ in range(when):
        engine.step()
    engine.abort(gone)
    engine.step()
    engine.abort(f"{kept}#1")  # one sample alone: its siblings go on
    while engine.has_unfinished_requests:
        engine.step()
        check_engine_invariants(engine)
    assert [r.finish_reason.value for r in engine.groups[gone]] == ["aborted"] * 3
    reasons = [r.finish_reason.value for r in engine.groups[kept]]
    assert reasons[0] == reasons[2] == "length" and reasons[1] in ("aborted", "length")
    check_all_finished(engine)


def test_sample_zero_aborted_before_the_fork_hands_the_prompt_to_the_next(model, prompts):
    engine = LLMEngine(model, EngineConfig(page_size=4))
    group = engine.add_request(prompts[3], SamplingParams(max_tokens=6, n=3, ignore_eos=True))
    engine.abort(f"{group}#0")
    while engine.has_unfinished_requests:
        engine.step()
    out = engine.output(group)
    want = model.generate(prompts[3], 6, stop_token_ids=[])
    assert [s.token_ids for s in out.samples] == [[], want, want]
    check_all_finished(engine)


def test_max_tokens_one_finishes_every_sample_at_its_fork(model, prompts):
    engine = LLMEngine(model, EngineConfig(page_size=4))
    (out,) = engine.generate([prompts[4]], SamplingParams(max_tokens=1, n=4))
    assert [len(s.token_ids) for s in out.samples] == [1] * 4 and all(s.finish_reason == "length"
                                                                      for s in out.samples)
    check_all_finished(engine)


def test_a_group_keeps_seats_for_its_samples(model, prompts):
    engine = LLMEngine(model, EngineConfig(page_size=4, max_num_seqs=4))
    params = SamplingParams(max_tokens=4, n=3, ignore_eos=True)
    for p in prompts[:3]:
        engine.add_request(p, params)
    while engine.has_unfinished_requests:
        engine.step()
        assert len(engine.scheduler.running) <= 4
    check_all_finished(engine)


class OwnSchedule(ContinuousScheduler):
    """A student-style scheduler: its own schedule(), which may know nothing of sample groups' seats."""

    def schedule(self):
        return super().schedule()


class OwnVictim(ContinuousScheduler):
    """A student-style preemption policy (notebook 7's StudentRecompute): schedule() is the engine's."""

    def choose_victim(self):
        return max((r for r in self.running if r.finish_reason is None), key=lambda r: r.admit_seq)


@pytest.mark.parametrize("config,kwargs,needle", [
    (dict(max_num_seqs=4), {}, "max_num_seqs = 4"),
    (dict(scheduler="static"), {}, "StaticScheduler has its own"),
    (dict(kv_layout="contiguous"), {}, "kv_layout 'paged'"),
    ({}, dict(scheduler=OwnSchedule), "OwnSchedule has its own"),
], ids=["too-many", "static", "contiguous", "own-scheduler"])
def test_parallel_sampling_is_refused_where_it_cannot_share(model, config, kwargs, needle):
    engine = LLMEngine(model, EngineConfig(page_size=4, **config), **kwargs)
    with pytest.raises(ValueError, match=needle):
        engine.add_request([3, 4, 5], SamplingParams(n=5))
    engine.generate([[3, 4, 5]], SamplingParams(max_tokens=2))  # n = 1 still serves


@pytest.mark.parametrize("kwargs,needle", [
    (dict(n=0), "n must be an integer >= 1"), (dict(n=2, best_of=1), "best_of must be an integer >= n = 2"),
    (dict(logprobs=21), r"logprobs must be None or an integer in \[0, 20\]"), (dict(n=True), "n must be"),
])
def test_bad_sampling_counts_name_the_limit(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(**kwargs)


def test_a_students_preemption_policy_serves_parallel_samples(model, prompts):
    expected = [model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=30, max_num_seqs=12, admission="none"),
                       scheduler=OwnVictim)
    outputs, _ = run_checked(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=3))
    assert [[s.token_ids for s in o.samples] for o in outputs] == [[want] * 3 for want in expected]
    assert engine.stats()["num_preemptions"] > 0
    check_all_finished(engine)


def test_the_scripted_runner_forks_too():
    from course_lib.model.config import ModelConfig

    engine = LLMEngine(ModelConfig(vocab_size=64, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8,
                                   hidden_size=8, intermediate_size=8, max_position_embeddings=256,
                                   eos_token_id=0), EngineConfig(page_size=4))
    (out,) = engine.generate([[5] * 10], SamplingParams(max_tokens=7, n=4))
    assert [len(s.token_ids) for s in out.samples] == [7] * 4
    assert engine.stats()["forked_pages"] == 3 * 3 and engine.stats()["copied_pages"] == 3
    with pytest.raises(ValueError, match="runner that reports them"):
        engine.add_request([5, 6], SamplingParams(n=2, best_of=3))
