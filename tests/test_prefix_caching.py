"""Prefix caching changes how much is computed, never what is generated."""
import pytest

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool
from course_lib.kv.prefix_cache import PrefixCache
from conftest import random_prompts
from invariants import check_all_finished, check_engine_invariants

MAX_TOKENS = 10


def _serve(model, prompts, step_check=True, **cfg):
    engine = LLMEngine(model, EngineConfig(**cfg))
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in prompts]
    while engine.has_unfinished_requests:
        engine.step()
        if step_check:
            check_engine_invariants(engine)
    check_all_finished(engine)
    return [engine.requests[i].output_token_ids for i in ids], engine


def _workloads(vocab):
    base = random_prompts(4, vocab, lo=20, hi=30, seed=11)
    system = base[0][:21]  # 21 tokens: 5 full pages of 4 and one token into the sixth
    return {
        "repeated identical prompts": [base[1]] * 4 + [base[2]] * 2,
        "shared partial page": [system + p[:9] for p in base],
        "prompt exactly full pages": [base[3][:16]] * 3,
    }


@pytest.mark.parametrize("name", ["repeated identical prompts", "shared partial page", "prompt exactly full pages"])
@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_outputs_equal_with_caching_on_and_off(small_model, name, scheduler):
    prompts = _workloads(small_model.config.vocab_size)[name]
    expected = [small_model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    cfg = dict(page_size=4, max_num_seqs=2, scheduler=scheduler)
    off, _ = _serve(small_model, prompts, enable_prefix_caching=False, **cfg)
    on, engine = _serve(small_model, prompts, enable_prefix_caching=True, **cfg)
    assert off == expected and on == expected
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] > 0, "later requests should have reused earlier pages"
    assert 0 < stats["prefix_hit_rate"] < 1


def test_fully_cached_prompt_still_computes_its_last_token(small_model):
    prompt = random_prompts(1, small_model.config.vocab_size, lo=12, hi=12, seed=12)[0]  # 3 full pages of 4
    out, engine = _serve(small_model, [prompt, prompt], page_size=4, max_num_seqs=1, enable_prefix_caching=True)
    assert out[0] == out[1] == small_model.generate(prompt, MAX_TOKENS, stop_token_ids=[])
    second = engine.requests["req-1"]
    assert second.num_cached_tokens == 8, "two full pages reused, the third recomputed to get a first token"


def test_tiny_pool_evicts_and_recomputes_cached_pages(small_model):
    vocab = small_model.config.vocab_size
    prompts = [p + q for p, q in zip(random_prompts(3, vocab, lo=24, hi=24, seed=13) * 3,
                                      random_prompts(9, vocab, lo=1, hi=8, seed=14))]
    expected = [small_model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    out, engine = _serve(small_model, prompts, page_size=4, num_pages=22, max_num_seqs=3,
                         enable_prefix_caching=True, admission="none", max_num_batched_tokens=16)
    assert out == expected
    assert engine.stats()["num_preemptions"] > 0 or engine.stats()["prefix_hit_tokens"] > 0


def test_a_forced_hash_collision_does_not_corrupt_output(small_model):
    vocab = small_model.config.vocab_size
    prompts = random_prompts(5, vocab, lo=10, hi=30, seed=15)
    prompts += [prompts[0], prompts[1][:13]]  # real hits must still work through the collisions
    expected = [small_model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    pool = BlockPool(num_pages=80, page_size=4)
    cache = PrefixCache(pool, hash_fn=lambda key: 42)  # every page key collides
    engine = LLMEngine(small_model, EngineConfig(page_size=4, max_num_seqs=2), block_pool=pool, prefix_cache=cache)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outputs] == expected


def test_lookup_confirms_tokens_and_parent():
    pool = BlockPool(num_pages=8, page_size=2)
    cache = PrefixCache(pool, hash_fn=lambda key: 7)  # all keys equal: only confirmation separates them
    a, b = pool.allocate(2)
    s = cache.register(a, 0, (1, 2))
    cache.register(b, s, (3, 4))
    assert cache.lookup([1, 2, 3, 4], 2)[0] == [a]  # b's key was taken by a: b stays private
    assert cache.lookup([9, 9, 3, 4], 2)[0] == []


def test_shared_pages_count_once_in_kv_accounting():
    from course_lib.model.config import ModelConfig

    mc = ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
                     num_kv_heads=1, max_position_embeddings=256, eos_token_id=2)
    engine = LLMEngine(mc, EngineConfig(page_size=16, num_pages=12, enable_prefix_caching=True, admission="none"))
    prefix = [5] * 64
    engine.add_request(prefix + [6], SamplingParams(max_tokens=40), scripted_output_len=40)
    engine.step()
    for t in (7, 8, 9):
        engine.add_request(prefix + [t], SamplingParams(max_tokens=40), scripted_output_len=40)
    engine.step()
    s = engine.step_stats[-1]
    # 4 shared prefix pages + 1 private tail page each = 8 pages. Tails: the first request has
    # decoded one token past its 65-token prompt (2 in its tail), the others computed their 65th.
    assert s.kv_allocated_slots == 8 * 16 <= s.kv_total_slots
    assert s.kv_used_slots == 64 + 2 + 3 * 1
