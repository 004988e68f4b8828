"""Bad input is refused at add_request with a message naming the problem and the limit,
and the requests already in flight finish with unchanged outputs."""
import pytest

from course_lib import EngineConfig, LLMEngine, SamplingParams
from conftest import random_prompts


def _engine(model, **kw):
    return LLMEngine(model, EngineConfig(page_size=4, num_pages=20, max_num_seqs=4, **kw))


BAD = [
    ("empty prompt", lambda v: ([], SamplingParams(max_tokens=4)), "empty prompt"),
    ("unknown token", lambda v: ([1, v, 2], SamplingParams(max_tokens=4)), rf"outside the vocabulary \[0, {61}\)"),
    ("negative token", lambda v: ([-1], SamplingParams(max_tokens=4)), "outside the vocabulary"),
    ("too long for the model", lambda v: ([5] * 96, SamplingParams(max_tokens=4)), "max_model_len is 96"),
    ("too big for the pool", lambda v: ([5] * 90, SamplingParams(max_tokens=5)), "whole pool holds 80"),
]


@pytest.mark.parametrize("speculative", ["none", "ngram"])
@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_refused_and_harms_no_one(small_model, name, make, message, speculative):
    model = small_model
    prompts = random_prompts(3, model.config.vocab_size, seed=5)
    expected = [model.generate(p, 8, stop_token_ids=[]) for p in prompts]
    engine = _engine(model, speculative=speculative)
    ids = [engine.add_request(p, SamplingParams(max_tokens=8)) for p in prompts]
    engine.step()  # requests are in flight when the bad one arrives
    prompt, params = make(model.config.vocab_size)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests:
        engine.step()
    assert [engine.requests[i].output_token_ids for i in ids] == expected


def test_max_tokens_below_one_names_the_limit():
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1, got 0"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-5), "top_k must be >= 1"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_duplicate_request_id_and_unknown_abort(small_model):
    engine = _engine(small_model)
    engine.add_request([3, 4, 5], request_id="a")
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        engine.add_request([3, 4], request_id="a")
    with pytest.raises(ValueError, match="cannot abort unknown request id 'zzz'"):
        engine.abort("zzz")


@pytest.mark.parametrize("field,value,message", [
    ("page_size", 0, "page_size must be >= 1"),
    ("scheduler", "fifo", "scheduler must be 'continuous' or 'static'"),
    ("kv_layout", "ring", "kv_layout must be 'paged' or 'contiguous'"),
    ("admission", "yes", "admission must be 'none', 'reserve' or 'watermark'"),
    ("speculative", "medusa", "speculative must be 'none', 'ngram' or 'draft'"),
    ("num_speculative_tokens", 0, "num_speculative_tokens must be >= 1"),
    ("spec_acceptance_rate", 1.5, r"spec_acceptance_rate must be within \[0, 1\]"),
])
def test_bad_engine_config(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})


def test_generate_validates_every_prompt_before_queuing_any(small_model):
    engine = _engine(small_model)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[3, 4], []], SamplingParams(max_tokens=2))
    assert not engine.requests, "a refused batch must not leave half of itself queued"


@pytest.mark.parametrize("speculative", ["none", "ngram", "draft"])
def test_abort_frees_pages_and_others_finish(small_model, speculative):
    model = small_model
    prompts = random_prompts(3, model.config.vocab_size, seed=6)
    expected = [model.generate(p, 10, stop_token_ids=[]) for p in prompts]
    engine = _engine(model, speculative=speculative)
    ids = [engine.add_request(p, SamplingParams(max_tokens=10)) for p in prompts]
    victim = engine.add_request([7] * 20, SamplingParams(max_tokens=30))
    for _ in range(3):
        engine.step()
    engine.abort(victim)
    assert engine.requests[victim].finish_reason.value == "aborted"
    while engine.has_unfinished_requests:
        engine.step()
    assert [engine.requests[i].output_token_ids for i in ids] == expected
    assert engine.pool.num_free_pages == engine.pool.num_pages
