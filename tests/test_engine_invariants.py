"""Property tests: random arrivals, lengths, aborts and tiny pools never break the bookkeeping."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.model.config import ModelConfig
from invariants import check_all_finished, check_engine_invariants

SCRIPTED_MODEL = ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                             num_kv_heads=1, max_position_embeddings=64, eos_token_id=2)

configs = st.fixed_dictionaries({
    "page_size": st.sampled_from([1, 2, 4, 16]),
    "num_pages_tokens": st.integers(64, 400),
    "max_num_seqs": st.integers(1, 8),
    "max_num_batched_tokens": st.integers(4, 80),
    "scheduler": st.sampled_from(["continuous", "static"]),
    "kv_layout": st.sampled_from(["paged", "contiguous"]),
    "admission": st.sampled_from(["none", "reserve", "watermark"]),
    "preemption": st.sampled_from(["recompute", "fail"]),
    "enable_chunked_prefill": st.booleans(),
    "enable_prefix_caching": st.booleans(),
    "speculative": st.sampled_from(["none", "ngram"]),  # (the scripted runner keeps 70% of the drafts)
    "num_speculative_tokens": st.integers(1, 4),
})

events = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 30), st.integers(1, 30), st.integers(0, 2)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("step"), st.integers(1, 4)),
), min_size=1, max_size=40)


def _build(c):
    # max_model_len 64 for both the scripted and the real model, so a contiguous pool of at
    # least 64 tokens always holds one request.
    tokens = c.pop("num_pages_tokens")
    if c["scheduler"] == "static":
        c["speculative"] = "none"  # only the continuous scheduler drafts (the engine refuses the rest)
    return EngineConfig(num_pages=max(tokens // c["page_size"], 64 // c["page_size"] + 1), max_model_len=64, **c)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=configs, script=events)
def test_random_load_keeps_every_invariant(c, script):
    engine = LLMEngine(SCRIPTED_MODEL, _build(dict(c)))
    ids = []
    for ev in script:
        if ev[0] == "add":
            _, prompt_len, max_tokens, out_len, prefix = ev
            prompt = ([7] * 12 * prefix + [3 + (len(ids) + i) % 40 for i in range(prompt_len)])[:60]
            try:
                ids.append(engine.add_request(prompt, SamplingParams(max_tokens=max_tokens),
                                              scripted_output_len=out_len))
            except ValueError:
                pass  # refused (e.g. bigger than the pool): refusing is allowed, corrupting is not
        elif ev[0] == "abort" and ids:
            engine.abort(ids[ev[1] % len(ids)])
        else:
            for _ in range(ev[1]):
                engine.step()
                check_engine_invariants(engine)
    for _ in range(10_000):
        if not engine.has_unfinished_requests:
            break
        engine.step()
        check_engine_invariants(engine)
    check_all_finished(engine)
    for rid in ids:
        r = engine.requests[rid]
        if r.finish_reason.value in ("eos", "length"):
            assert r.num_output_tokens <= r.sampling_params.max_tokens


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(c=configs, n=st.integers(1, 6), seed=st.integers(0, 1000))
def test_random_configs_with_the_real_model_match_plain_generate(small_model, c, n, seed):
    import random

    c = dict(c, preemption="recompute")
    if c["speculative"] != "none" and seed % 2:
        c["speculative"] = "draft"  # the model's first layer drafts
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 61) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    if c["enable_prefix_caching"] and n > 1:
        prompts = [prompts[0][:20] + p for p in prompts]  # a shared prefix so pages are actually shared
    expected = [small_model.generate(p, 10, stop_token_ids=[]) for p in prompts]
    engine = LLMEngine(small_model, _build(c))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=10))
    assert [o.token_ids for o in outputs] == expected
    check_all_finished(engine)


def test_a_policy_stricter_than_the_pool_still_admits_into_an_empty_engine():
    from course_lib import EngineConfig as EC

    engine = LLMEngine(SCRIPTED_MODEL, EC(page_size=16, num_pages=4, admission="watermark", watermark=0.5))
    engine.add_request([5] * 60, SamplingParams(max_tokens=4), scripted_output_len=4)
    for _ in range(50):
        if not engine.has_unfinished_requests:
            break
        engine.step()
    check_all_finished(engine)


def test_static_bus_arrives_when_its_last_rider_is_aborted():
    """Found by the random-load test: on the static scheduler, a request that finished early waits for the
    bus; when the last request still riding was aborted, no step ended the ride and the waiting one was
    never delivered. The next step now delivers it."""
    engine = LLMEngine(SCRIPTED_MODEL, EngineConfig(scheduler="static", page_size=1, num_pages=65, max_num_seqs=2,
                                                    max_model_len=64, admission="none"))
    first = engine.add_request([3], SamplingParams(max_tokens=1), scripted_output_len=1)
    second = engine.add_request([4], SamplingParams(max_tokens=2), scripted_output_len=2)
    engine.step()
    engine.abort(second)
    for _ in range(5):
        if not engine.has_unfinished_requests:
            break
        engine.step()
    check_all_finished(engine)
    assert engine.requests[first].finish_time is not None
    check_engine_invariants(engine)
