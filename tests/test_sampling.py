"""Seeded sampling is reproducible and does not depend on what else is in the batch."""
from course_lib import EngineConfig, LLMEngine, SamplingParams
from conftest import random_prompts


def _run(model, prompts, params, **cfg):
    return [o.token_ids for o in LLMEngine(model, EngineConfig(page_size=4, **cfg)).generate(prompts, params)]


def test_seeded_sampling_is_reproducible_and_batch_independent(small_model):
    model = small_model
    prompts = random_prompts(6, model.config.vocab_size, seed=7)
    params = [SamplingParams(max_tokens=12, temperature=1.3, top_k=20, top_p=0.9, seed=100 + i) for i in range(6)]
    together = _run(model, prompts, params)
    assert together == _run(model, prompts, params), "same seeds, different samples"
    alone = [_run(model, [p], [sp])[0] for p, sp in zip(prompts, params)]
    assert together == alone, "a request's samples changed with the company it kept"
    reordered = _run(model, prompts[::-1], params[::-1])[::-1]
    assert together == reordered
    # ...and with a pool so small that requests are preempted and recomputed mid-way.
    assert together == _run(model, prompts, params, num_pages=40, admission="none")


def test_different_seeds_give_different_samples(small_model):
    prompt = random_prompts(1, small_model.config.vocab_size, seed=8)
    a = _run(small_model, prompt, SamplingParams(max_tokens=20, temperature=2.0, seed=1))
    b = _run(small_model, prompt, SamplingParams(max_tokens=20, temperature=2.0, seed=2))
    assert a != b


def test_top_k_one_and_tiny_top_p_are_greedy(small_model):
    model = small_model
    prompts = random_prompts(3, model.config.vocab_size, seed=9)
    greedy = [model.generate(p, 8, stop_token_ids=[]) for p in prompts]
    assert _run(model, prompts, SamplingParams(max_tokens=8, temperature=1.0, top_k=1, seed=3)) == greedy
    assert _run(model, prompts, SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-6, seed=3)) == greedy
