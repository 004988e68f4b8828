"""`num_cached_tokens` is what its docstring says across preemption: the prompt tokens served from
the prefix cache at the request's latest admission, never more than the prompt.

A preempted request is re-admitted over its prompt *and* the tokens it already generated; the
pages it filled with those may still be cached, so the cache hit reaches past the prompt. Its
progress may skip all of them (that saves recompute and changes no output), but only the
prompt's share is a cached *prompt* token. Before the fix, this file's run reported 24 cached
tokens for a 14-token prompt and a cached-token fraction of 1.14."""
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.engine import RequestOutput
from course_lib.sim.metrics import summarize
from conftest import random_prompts

PROMPT_LEN = 14
MAX_TOKENS = 40
# 20 pages of 4 (80 slots) hold one request whole (14 + 40 - 1 = 53 slots) but not two: the
# second is preempted, and its freed pages (prompt and generated tokens) stay in the cache.
CONFIG = dict(page_size=4, num_pages=20, max_num_seqs=4, enable_prefix_caching=True, admission="none")


def _serve_with_preemption(model):
    engine = LLMEngine(model, EngineConfig(**CONFIG))
    hits_past_prompt = []  # tokens the cached pages held beyond the prompt, per admission

    allocate = engine.kv.allocate

    def spy_allocate(request, num_new_tokens, cached_pages=()):
        held = allocate(request, num_new_tokens, cached_pages)
        hits_past_prompt.append(held - request.num_prompt_tokens)
        return held

    engine.kv.allocate = spy_allocate
    prompts = random_prompts(3, model.config.vocab_size, lo=PROMPT_LEN, hi=PROMPT_LEN, seed=3)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    return engine, prompts, outputs, hits_past_prompt


def test_cached_tokens_never_exceed_the_prompt_across_preemption(small_model):
    engine, prompts, outputs, hits_past_prompt = _serve_with_preemption(small_model)
    # The scenario the bug needs, or this test proves nothing: a preemption, and a re-admission
    # whose cached pages hold generated tokens as well as the whole prompt.
    assert engine.scheduler.num_preemptions > 0, "the pool should force a preemption"
    assert max(hits_past_prompt) > 0, "a re-admission should hit cached pages beyond its prompt"
    for r in engine.requests.values():
        assert 0 <= r.num_cached_tokens <= r.num_prompt_tokens, (
            f"{r.request_id}: {r.num_cached_tokens} cached tokens for a {r.num_prompt_tokens}-token prompt")
    for o in outputs:
        assert 0 <= o.num_cached_tokens <= len(o.prompt_token_ids)
    assert any(r.num_cached_tokens == PROMPT_LEN for r in engine.requests.values()), (
        "a request re-admitted over its whole cached prompt counts all of it")
    # Skipping the cached generated tokens is still right: outputs equal the dense model's.
    assert [o.token_ids for o in outputs] == [
        small_model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]


def test_cached_token_fraction_is_at_most_one(small_model):
    engine, *_ = _serve_with_preemption(small_model)
    records = [RequestOutput.of(r) for r in engine.requests.values()]
    summary = summarize(records, engine.step_stats)
    assert 0.0 < summary["cached_token_frac"] <= 1.0, summary["cached_token_frac"]


def test_cached_tokens_count_the_prompt_share_of_the_hit():
    from course_lib.scheduler.request import Request

    request = Request("r", list(range(10)), SamplingParams())
    request.num_cached_tokens = 8  # cached pages inside the prompt: all of them are prompt tokens
    assert request.num_cached_tokens == 8
    request.num_cached_tokens = 24  # cached pages reaching into generated tokens: the prompt's share
    assert request.num_cached_tokens == 10
    request.num_cached_tokens = 0  # re-admitted with no hit
    assert request.num_cached_tokens == 0
