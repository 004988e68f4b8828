"""The roofline cost model matches hand arithmetic and puts decode and prefill on the right side."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.model.config import ModelConfig
from course_lib.scheduler.output import StepStats
from course_lib.sim.clock import SimulatedClock, WallClock
from course_lib.sim.hardware import GPUS, MODEL_SHAPES, ModelShape, count_params, get_gpu, get_model_shape
from course_lib.sim.roofline import DEFAULT_STEP_OVERHEAD_S, cost_of_step, roofline_cost, step_time

LLAMA_8B = MODEL_SHAPES["llama-3-8b"]
H100 = GPUS["H100"]


def _stats(**kw) -> StepStats:
    base = dict(
        step=0, start_time=0.0, end_time=0.0, num_running=0, num_waiting=0, num_prefill_tokens=0,
        num_decode_tokens=0, num_padded_tokens=0, context_tokens_read=0, attention_context_tokens=0, kv_tokens_written=0,
        kv_used_slots=0, kv_allocated_slots=0, kv_total_slots=1024, num_preemptions=0,
    )
    base.update(kw)
    return StepStats(**base)


def test_kv_bytes_per_token_of_llama_3_8b():
    # K and V x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131,072 bytes (128 KiB) per token.
    assert LLAMA_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072


def test_one_decode_step_by_hand():
    # 8 sequences decode one token each, with 1,000 tokens of context apiece, on an H100.
    cost = roofline_cost(
        H100, LLAMA_8B, num_tokens=8, kv_tokens_read=8_000, kv_tokens_written=8, attention_context_tokens=8_000
    )
    # FLOPs: matmuls 2 x 8.03e9 params x 8 tokens              = 1.2848e11
    #        attention 4 x 32 layers x 32 heads x 128 x 8,000   = 4.194304e9
    flops = 2 * 8.03e9 * 8 + 4 * 32 * 32 * 128 * 8_000
    assert flops == pytest.approx(1.32674304e11)
    # Bytes: weights 8.03e9 x 2                                  = 1.606e10
    #        KV (8,000 read + 8 written) x 131,072               = 1.049624576e9
    nbytes = 8.03e9 * 2 + 8_008 * 131_072
    assert nbytes == pytest.approx(1.7109624576e10)
    compute_s = flops / 989e12  # 0.134 ms
    memory_s = nbytes / 3.35e12  # 5.107 ms
    assert cost.flops == pytest.approx(flops)
    assert cost.bytes == pytest.approx(nbytes)
    assert cost.compute_s == pytest.approx(compute_s)
    assert cost.memory_s == pytest.approx(memory_s)
    assert cost.total_s == pytest.approx(memory_s + 0.002)  # + the 2 ms default overhead
    assert cost.total_s == pytest.approx(7.1073e-3, rel=1e-4)
    assert cost.bound == "memory"
    assert step_time(H100, LLAMA_8B, num_tokens=8, kv_tokens_read=8_000, kv_tokens_written=8,
                     attention_context_tokens=8_000) == cost.total_s


def test_big_prefill_is_compute_bound_and_decode_memory_bound():
    n = 4096
    prefill = roofline_cost("h100", "llama-3-8b", num_tokens=n, kv_tokens_written=n,
                            attention_context_tokens=n * (n + 1) // 2)
    decode = roofline_cost("h100", "llama-3-8b", num_tokens=1, kv_tokens_read=n, kv_tokens_written=1,
                           attention_context_tokens=n)
    assert prefill.bound == "compute" and decode.bound == "memory"
    assert prefill.arithmetic_intensity > H100.ridge_intensity > decode.arithmetic_intensity
    # Decode is weight-read dominated: doubling the batch barely moves the step time.
    decode2 = roofline_cost("h100", "llama-3-8b", num_tokens=2, kv_tokens_read=2 * n, kv_tokens_written=2,
                            attention_context_tokens=2 * n)
    assert decode2.total_s < 1.1 * decode.total_s


def test_padding_costs_flops_and_an_empty_step_costs_only_overhead():
    plain = roofline_cost(H100, LLAMA_8B, num_tokens=512)
    padded = roofline_cost(H100, LLAMA_8B, num_tokens=512, num_padded_tokens=512)
    assert padded.flops == pytest.approx(2 * plain.flops)
    empty = roofline_cost(H100, LLAMA_8B, num_tokens=0, overhead_s=0.001)
    assert empty.flops == 0 and empty.bytes == 0 and empty.total_s == 0.001
    with pytest.raises(ValueError, match="num_tokens"):
        roofline_cost(H100, LLAMA_8B, num_tokens=-1)


def test_cost_of_step_reads_step_stats():
    # 4 decodes with 100 tokens of context each: per-query sum == per-sequence reads.
    decode = _stats(num_decode_tokens=4, context_tokens_read=400, attention_context_tokens=400, kv_tokens_written=4)
    expected = roofline_cost(H100, LLAMA_8B, num_tokens=4, kv_tokens_read=400, kv_tokens_written=4,
                             attention_context_tokens=400)
    assert cost_of_step(decode, H100, LLAMA_8B) == expected
    assert step_time(H100, LLAMA_8B, decode) == expected.total_s
    assert step_time(H100, LLAMA_8B, decode, overhead_s=0.0) == pytest.approx(expected.total_s - 0.002)
    # A 1,000-token prefill: the queries attend to 500,500 (query, key) pairs (FLOPs) but the
    # kernel reads the sequence's 1,000 K/V tokens once (bytes).
    prefill = _stats(num_prefill_tokens=1000, context_tokens_read=1000, attention_context_tokens=500_500,
                     kv_tokens_written=1000, num_padded_tokens=24)
    cost = cost_of_step(prefill, H100, LLAMA_8B, overhead_s=0.0)
    assert cost.bytes == pytest.approx(LLAMA_8B.weight_bytes + 2000 * LLAMA_8B.kv_bytes_per_token)
    assert cost.flops == pytest.approx(2 * 8.03e9 * 1024 + 4 * 32 * 32 * 128 * 500_500)
    assert cost.overhead_s == 0.0


def test_shapes_and_gpus_by_name():
    assert get_gpu("a100").mem_bandwidth == 2.039e12
    assert get_gpu("T4").peak_flops == 65e12
    with pytest.raises(ValueError, match="known"):
        get_gpu("B200-ish")
    with pytest.raises(ValueError, match="known"):
        get_model_shape("gpt-17")
    assert get_model_shape("Llama-3-70B").num_layers == 80


def test_from_config_counts_llama_3_8b_parameters():
    cfg = ModelConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32,
                      num_heads=32, num_kv_heads=8)
    assert count_params(cfg) == pytest.approx(8.03e9, rel=1e-3)
    shape = ModelShape.from_config(cfg, name="llama-like")
    assert shape.kv_bytes_per_token == LLAMA_8B.kv_bytes_per_token
    assert shape.head_dim == 128 and shape.name == "llama-like"


def test_simulated_clock_advances_by_the_roofline_cost():
    clock = SimulatedClock("H100", "llama-3-8b")
    stats = _stats(num_decode_tokens=4, context_tokens_read=400, attention_context_tokens=400, kv_tokens_written=4)
    dt = clock.charge(stats)
    assert dt == cost_of_step(stats, H100, LLAMA_8B).total_s and clock.now() == dt
    assert dt > DEFAULT_STEP_OVERHEAD_S
    clock.wait_until(5.0)
    assert clock.now() == 5.0
    clock.wait_until(1.0)  # never backwards
    assert clock.now() == 5.0


def test_wall_clock_reports_measured_durations():
    clock = WallClock()
    t0 = clock.now()
    assert clock.charge(_stats(start_time=1.0, end_time=1.25)) == 0.25
    clock.wait_until(t0 + 100.0)  # returns at once, advances nothing
    assert clock.now() < t0 + 100.0
    skipping = WallClock(skip_idle=True)
    skipping.wait_until(100.0)
    assert skipping.now() >= 100.0


@settings(max_examples=50, deadline=None)
@given(tokens=st.integers(0, 10_000), extra=st.integers(1, 10_000), ctx=st.integers(0, 10**6))
def test_more_tokens_never_cost_less(tokens, extra, ctx):
    a = roofline_cost(H100, LLAMA_8B, num_tokens=tokens, attention_context_tokens=ctx, kv_tokens_read=ctx)
    b = roofline_cost(H100, LLAMA_8B, num_tokens=tokens + extra, attention_context_tokens=ctx, kv_tokens_read=ctx)
    assert b.total_s >= a.total_s
    assert a.total_s == pytest.approx(max(a.compute_s, a.memory_s) + a.overhead_s)


# --------------------------------------------------------------------------- speculative decoding
def test_expected_tokens_per_drafted_step_by_hand():
    from course_lib.sim.speculative import expected_tokens_per_step

    assert expected_tokens_per_step(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)  # 2.533
    assert expected_tokens_per_step(0.0, 5) == 1.0  # every draft rejected: the target's own token only
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 0) == 1.0
    with pytest.raises(ValueError, match="acceptance_rate"):
        expected_tokens_per_step(1.5, 3)


def test_a_drafted_step_is_priced_as_1_plus_k_tokens_reading_each_sequence_once():
    """The engine records a drafted decode as 1 + k tokens whose queries share one K/V read of their
    sequence, and the simulated clock prices exactly those counts (sim/speculative.decode_step_counts)."""
    from course_lib.engine import LLMEngine
    from course_lib.engine_config import EngineConfig
    from course_lib.scheduler.sampling import SamplingParams
    from course_lib.sim.speculative import decode_step_cost, decode_step_counts

    batch, k = 4, 3
    # The scripted runner answers 3 (its filler) first: each prompt has "3 4 5 6" to look up, so the
    # n-gram drafter proposes 4 5 6 at the first decode.
    prompts = [[7 + i, 3, 4, 5, 6, 8 + i, 9, 10, 11, 12] for i in range(batch)]
    context = len(prompts[0])
    clock = SimulatedClock("H100", "llama-3-8b")
    engine = LLMEngine(ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                                   num_kv_heads=1, max_position_embeddings=64, eos_token_id=2),
                       EngineConfig(speculative="ngram", num_speculative_tokens=k, max_num_batched_tokens=256),
                       clock=clock)
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=30), scripted_output_len=30)
    engine.step()  # every prefill, and each request's first token
    assert engine.step_stats[-1].num_prefill_tokens == batch * context
    engine.step()
    drafted = engine.step_stats[-1]
    want = decode_step_counts(batch, context, k)
    got = {key: getattr(drafted, key) for key in want}
    assert got == want
    assert drafted.num_prefill_tokens == 0 and drafted.num_accepted_tokens <= drafted.num_draft_tokens
    # KV read once per sequence: batch x (context + 1 + k), not batch x (1 + k) x context.
    assert drafted.context_tokens_read == batch * (context + 1 + k)
    assert clock.last_cost.total_s == pytest.approx(decode_step_cost(batch, context, k).total_s)
    # ... and nearly the price of a plain decode step: both read the same 16 GB of weights.
    plain = decode_step_cost(batch, context, 0)
    assert plain.total_s < clock.last_cost.total_s < 1.01 * plain.total_s


def test_speculation_pays_while_decode_is_memory_bound_and_stops_once_compute_bound():
    from course_lib.sim.speculative import compare_decode, crossing_batch

    context = 500
    for batch in (1, 2, 4):
        c = compare_decode(batch, context)
        assert c["plain"]["bound"] == c["speculative"]["bound"] == "memory"
        assert c["speculative"]["tpot_s"] < 0.5 * c["plain"]["tpot_s"]  # ~2.5 tokens a step for ~the same step
    crossing = crossing_batch(context)
    assert crossing is not None and crossing > 4
    at, before = compare_decode(crossing, context), compare_decode(crossing - 1, context)
    assert at["gain"] <= 1.0 < before["gain"]
    assert at["speculative"]["bound"] == "compute"  # 1 + k rows per request fill the GPU's arithmetic
    # More drafts reach the compute roof sooner. A longer context reaches it later, or never: each
    # sequence's K/V read grows with it and keeps even a big batch memory-bound (at 1,000 tokens of
    # Llama-3-8B context an H100 never gets there).
    assert crossing_batch(context, num_speculative_tokens=7) < crossing
    assert crossing_batch(context // 2) < crossing
    assert crossing_batch(2 * context, max_batch=2048) is None


def test_a_draft_models_passes_are_priced_at_its_share_of_the_layers():
    """A draft model that runs a share f of the target's layers: its k passes read f of the weights each
    and compute f of a target row per row; n-gram lookup (f = 0) costs nothing; the step waits for both."""
    from course_lib.sim.speculative import decode_step_cost, decode_step_counts

    gpu, shape = get_gpu("H100"), get_model_shape("llama-3-8b")
    batch, context, k, f = 4, 500, 3, 0.25
    plain = decode_step_cost(batch, context, k)
    drafted = decode_step_cost(batch, context, k, draft_layer_fraction=f)
    counts = decode_step_counts(batch, context, k, f)
    assert counts["draft_model_rows"] == batch * k and counts["draft_model_passes"] == k
    assert counts["draft_model_context_tokens"] == batch * sum(context + 1 + j for j in range(k))
    flops = f * (2 * shape.num_params * batch * k
                 + 4 * shape.num_layers * shape.num_heads * shape.head_dim * counts["draft_model_context_tokens"])
    moved = f * (k * shape.weight_bytes + (counts["draft_model_context_tokens"] + batch * k) * shape.kv_bytes_per_token)
    want = max(flops / gpu.peak_flops, moved / gpu.mem_bandwidth)
    assert plain.draft_s == 0.0 and drafted.draft_s == pytest.approx(want, rel=1e-12)
    assert drafted.total_s == pytest.approx(plain.total_s + want, rel=1e-12)
    assert moved / gpu.mem_bandwidth > flops / gpu.peak_flops  # a few rows: the passes wait on the weights
    assert (drafted.flops, drafted.bytes) == (plain.flops, plain.bytes)  # the target's pass, as before
    for bad in (dict(draft_layer_fraction=-0.1), dict(draft_layer_fraction=1.5), dict(draft_rows=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            roofline_cost("H100", "llama-3-8b", num_tokens=1, **bad)


def test_a_draft_model_makes_speculation_pay_less_and_stop_paying_sooner():
    from course_lib.sim.speculative import compare_decode, crossing_batch

    context = 256
    free, priced = compare_decode(1, context), compare_decode(1, context, draft_layer_fraction=0.25)
    assert priced["plain"] == free["plain"]
    assert free["speculative"]["tpot_s"] < priced["speculative"]["tpot_s"] < priced["plain"]["tpot_s"]
    shares = (0.0, 0.125, 0.25, 0.5)
    crossings = [crossing_batch(context, draft_layer_fraction=f, max_batch=2048) for f in shares]
    assert all(c is not None for c in crossings) and crossings == sorted(crossings, reverse=True), crossings
    assert len(set(crossings)) == len(shares), crossings
