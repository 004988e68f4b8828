"""The spine: every engine configuration reproduces the plain model's greedy tokens exactly, on a random
model, the shipped tiny model and a random transformers Qwen2 converted with from_hf (all float64)."""
import itertools

import pytest
import torch

from course_lib import EngineConfig, LLMEngine, SamplingParams
from conftest import random_model, random_prompts

MAX_TOKENS = 14

# forward: the PyTorch model ("eager") and the whole step in C ("cpu", what "auto" picks on a CPU)
CONFIGS = [
    dict(scheduler=s, kv_layout=kv, page_size=ps, enable_chunked_prefill=chunk, small_pool=small, forward=fwd)
    for s, kv, ps, chunk, small, fwd in itertools.product(
        ["continuous", "static"], ["paged", "contiguous"], [1, 4, 16], [True, False], [False, True], ["eager", "cpu"])
]


# Speculative decoding on (the continuous scheduler only drafts): each drafter with one and several drafts,
# small and large pages, tight and roomy pools (rollback frees pages, preemption recomputes), both forwards.
SPEC_CONFIGS = [
    dict(scheduler="continuous", kv_layout=kv, page_size=ps, enable_chunked_prefill=True, small_pool=small,
         forward=fwd, speculative=spec, num_speculative_tokens=k)
    for spec, k, kv, ps, small, fwd in itertools.product(
        ["ngram", "draft"], [1, 4], ["paged"], [1, 16], [False, True], ["eager", "cpu"])
] + [dict(scheduler="continuous", kv_layout="contiguous", page_size=16, enable_chunked_prefill=False, small_pool=True,
          forward="cpu", speculative=spec, num_speculative_tokens=3) for spec in ("ngram", "draft")]


def _engine_config(model, scheduler, kv_layout, page_size, enable_chunked_prefill, small_pool, forward, **more):
    max_len = model.config.max_position_embeddings
    if small_pool:  # paged: room for ~3 requests' worth of tokens, so decodes must preempt
        # (drafted requests finish in fewer steps, so fewer of them overlap: a tighter pool for those)
        tokens = 100 if more.get("speculative") else 150
        num_pages = tokens // page_size if kv_layout == "paged" else 2 * max_len // page_size
    else:
        num_pages = None
    return EngineConfig(page_size=page_size, num_pages=num_pages, scheduler=scheduler, kv_layout=kv_layout,
                        enable_chunked_prefill=enable_chunked_prefill, max_num_seqs=6,
                        max_num_batched_tokens=24 if enable_chunked_prefill else 256, admission="none",
                        forward=forward, **more)


def _model(kind: str):
    """float64 models the matrix runs on: a random one (GQA), the shipped tiny model, and a random
    transformers Qwen2 (q/k/v biases, tied embeddings) converted with from_hf."""
    if kind == "random":
        return random_model(1)
    if kind == "tiny":
        from course_lib import load_tiny

        return load_tiny(torch.float64)[0]
    hf_tests = pytest.importorskip("test_hf_parity")  # skips only where transformers is missing
    from course_lib.model.hf import from_hf

    return from_hf(hf_tests.make_hf("qwen2", heads=4, kv_heads=2, seed=3))


@pytest.fixture(scope="module", params=["random", "tiny", "hf_qwen2"])
def case(request):
    model = _model(request.param)
    prompts = random_prompts(9, model.config.vocab_size, lo=1, hi=45, seed=1)
    expected = [model.generate(p, MAX_TOKENS, stop_token_ids=[]) for p in prompts]
    return model, prompts, expected


@pytest.mark.parametrize("cfg", CONFIGS + SPEC_CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_engine_matches_plain_generate(case, cfg):
    model, prompts, expected = case
    engine = LLMEngine(model, _engine_config(model, **cfg))
    assert engine.runner.forward == cfg["forward"]
    # EOS is not a stop: plain generate above ran every request to MAX_TOKENS
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.token_ids == want, f"prompt {i} (len {len(prompts[i])}) diverged under {cfg}"
        assert out.finish_reason == "length"
    if cfg["small_pool"] and cfg["kv_layout"] == "paged":
        assert engine.stats()["num_preemptions"] > 0, "the small pool was meant to force preemptions"
    assert engine.pool.num_free_pages == engine.pool.num_pages, "pages leaked"
    if cfg.get("speculative"):
        assert engine.scheduler.num_draft_tokens > 0, "the drafter was meant to draft"


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
def test_attention_backends_serve_identical_tokens(case, backend):
    model, prompts, expected = case
    config = EngineConfig(page_size=4, attention_backend=backend, max_num_batched_tokens=32, forward="eager")
    engine = LLMEngine(model, config)
    outputs = engine.generate(prompts[:4], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected[:4]


def test_an_injected_decode_function_serves_the_decode_rows(case):
    model, prompts, expected = case
    calls = []

    def my_decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
        from course_lib.attention import paged_decode

        calls.append(q.shape[0])
        return paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, backend="reference")

    engine = LLMEngine(model, EngineConfig(page_size=4), attention=my_decode)
    outputs = engine.generate(prompts[:3], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected[:3]
    assert calls, "the injected attention was never called"


@pytest.mark.parametrize("speculative", ["none", "ngram", "draft"])
def test_eos_and_stop_tokens_end_requests_like_plain_generate(speculative):
    model = random_model(2)
    prompts = random_prompts(5, model.config.vocab_size, seed=2)
    free_run = [model.generate(p, 12, stop_token_ids=[]) for p in prompts]
    stop = free_run[0][3]  # a token we know appears: request 0 must stop right there
    expected = [model.generate(p, 12, stop_token_ids=[stop]) for p in prompts]
    # (drafted: a stop among the kept drafts ends the request there, not after the row)
    engine = LLMEngine(model, EngineConfig(page_size=4, speculative=speculative, num_speculative_tokens=4))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=12, stop_token_ids=[stop]))
    assert [o.token_ids for o in outputs] == expected
    assert outputs[0].finish_reason == "stop" and outputs[0].token_ids[-1] == stop


def test_float32_engine_matches_float32_plain_generate():
    model = random_model(3).to(torch.float32)
    prompts = random_prompts(4, model.config.vocab_size, seed=3)
    expected = [model.generate(p, 10, stop_token_ids=[]) for p in prompts]
    outputs = LLMEngine(model, EngineConfig(page_size=8)).generate(prompts, SamplingParams(max_tokens=10))
    assert [o.token_ids for o in outputs] == expected
