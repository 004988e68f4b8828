"""The "cpu" forward (model/cpu_forward.c) computes what the PyTorch model + PagedAttend compute.

Checked one step at a time against the eager path on the same batch and the same caches:
logits, and every key and value written. Greedy tokens through the whole engine are checked
by the parity matrix in test_engine_parity.py (which runs both forwards).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.bench.forward import bench_forward, eager_step, format_table, make_step
from course_lib.model import cpu_forward
from course_lib.model.config import ModelConfig
from course_lib.model.cpu_forward import CpuForward
from course_lib.model.transformer import Transformer

from conftest import random_model, random_prompts

# The C code normalises in float32 like the model, but sums in another order: float32 rounding
# (~1e-7 relative) reaches the logits even of a float64 model.
TOLERANCE = {torch.float64: 1e-5, torch.float32: 2e-4}


def assert_same_step(model, contexts, page_size, seed=0, padding_rows=0):
    caches, batch, num_decodes = make_step(model, contexts, page_size, seed, padding_rows)
    ours = [c.clone() for c in caches]
    L = model.config.num_layers
    logits = CpuForward(model, ours[:L], ours[L:])(**batch)
    want = eager_step(model, caches, batch, num_decodes)
    tol = TOLERANCE[model.dtype] * max(1.0, float(want.abs().max()))
    assert logits.shape == want.shape
    assert torch.allclose(logits, want, rtol=0, atol=tol), f"max logit difference {(logits - want).abs().max():.3g}"
    for got, expected in zip(ours, caches):  # the same keys and values written to the same slots
        assert torch.allclose(got, expected, rtol=0, atol=tol, equal_nan=True)


def model_with(dtype=torch.float64, seed=0, **shape):
    torch.manual_seed(seed)
    base = dict(vocab_size=53, hidden_size=24, intermediate_size=40, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, max_position_embeddings=64)
    model = Transformer(ModelConfig(**{**base, **shape}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4 if p.dim() == 2 else 1.0)
    return model.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decodes_prefill_chunks_and_padding_in_one_step(dtype):
    # decodes first (a single token after a cached context), then chunks: a fresh prompt, a
    # chunk continuing a cached prefix over a page boundary, a one-token prompt
    model = model_with(dtype)
    assert_same_step(model, [(9, 1), (0, 1), (31, 1), (0, 11), (13, 7), (0, 1)], page_size=4, padding_rows=2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kv_heads=st.integers(1, 3), group=st.integers(1, 3), head_dim=st.sampled_from([2, 4, 8, 16]),
    hidden=st.integers(4, 40), inter=st.integers(1, 48), layers=st.integers(1, 3),
    bias=st.booleans(), tied=st.booleans(), page_size=st.sampled_from([1, 3, 4, 16]),
    contexts=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=5),
    seed=st.integers(0, 1000),
)
def test_random_shapes_and_batches(kv_heads, group, head_dim, hidden, inter, layers, bias, tied, page_size,
                                   contexts, seed):
    model = model_with(num_heads=kv_heads * group, num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
                       intermediate_size=inter, num_layers=layers, attention_bias=bias, tie_word_embeddings=tied,
                       seed=seed)
    contexts = sorted(contexts, key=lambda c: c[1] > 1)  # the runner's order: decodes first
    assert_same_step(model, contexts, page_size, seed)


def test_the_comparison_catches_a_broken_forward(monkeypatch, tmp_path):
    """A check that cannot fail is a defect: let every prefill row see its whole chunk
    (future tokens included) and watch the step comparison fail."""
    monkeypatch.setenv("COURSE_LIB_KERNEL_CACHE", str(tmp_path))
    source = cpu_forward.SOURCE.read_text()
    broken = source.replace("a->seq_lens[s] - (int32_t)(a->query_start[s + 1] - 1 - r);", "a->seq_lens[s];")
    assert broken != source
    (tmp_path / "broken.c").write_text(broken)
    monkeypatch.setattr(cpu_forward.KERNEL, "source", tmp_path / "broken.c")
    monkeypatch.setattr(cpu_forward.KERNEL, "libraries", {})
    with pytest.raises(AssertionError, match="max logit difference"):
        assert_same_step(model_with(), [(3, 1), (0, 9)], page_size=4)


def test_bad_batches_are_refused_and_write_nothing():
    model = model_with()
    caches, batch, _ = make_step(model, [(5, 1), (0, 6)], page_size=4)
    L = model.config.num_layers
    forward = CpuForward(model, caches[:L], caches[L:])
    before = [c.clone() for c in caches]
    bad = [
        ("token id outside the vocabulary", dict(ids=batch["ids"].clone().index_fill_(0, torch.tensor([3]), 53))),
        ("slot outside the KV cache", dict(slot_mapping=batch["slot_mapping"] + 10_000)),
        ("page id outside the pool", dict(block_tables=batch["block_tables"].clone().fill_(-1))),
        ("logits row outside the batch", dict(logits_rows=torch.tensor([7]))),
        ("more logits rows than tokens", dict(logits_rows=torch.zeros(8, dtype=torch.long))),
        ("sequence lengths inconsistent", dict(seq_lens=torch.tensor([6, 5], dtype=torch.int32))),
        ("must be a contiguous CPU torch.int32", dict(seq_lens=batch["seq_lens"].long())),
        (r"query_start_loc \[3\]", dict(query_start_loc=batch["query_start_loc"][:2])),
    ]
    for message, change in bad:
        with pytest.raises(ValueError, match=message):
            forward(**{**batch, **change})
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(caches, before))


def test_positions_beyond_the_models_own_table_grow_it():
    model = model_with(max_position_embeddings=8)  # the engine may serve longer: max_model_len
    assert_same_step(model, [(20, 1), (5, 9)], page_size=4)


def test_weights_changed_after_the_engine_was_built_are_used():
    model = random_model(4)
    prompts = random_prompts(3, model.config.vocab_size, seed=4)
    engine = LLMEngine(model, EngineConfig(forward="cpu"))
    other = random_model(5)
    model.load_state_dict(other.state_dict())  # in place: same tensors, new values
    model.layers[0].o_proj = torch.nn.Parameter(other.layers[0].o_proj.clone())  # a new tensor
    expected = [other.generate(p, 6, stop_token_ids=[]) for p in prompts]
    assert [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=6))] == expected


def test_who_gets_which_forward(small_model):
    assert LLMEngine(small_model, EngineConfig()).runner.forward == "cpu"  # auto, on a CPU with a compiler
    assert LLMEngine(small_model, EngineConfig(forward="eager")).runner.forward == "eager"
    assert LLMEngine(small_model, EngineConfig(attention_backend="torch")).runner.forward == "eager"

    def my_decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
        raise AssertionError("not called here")

    assert LLMEngine(small_model, EngineConfig(), attention=my_decode).runner.forward == "eager"
    with pytest.raises(ValueError, match="cannot use a custom attention function"):
        LLMEngine(small_model, EngineConfig(forward="cpu"), attention=my_decode)
    with pytest.raises(ValueError, match="the attention backend is 'torch'"):
        LLMEngine(small_model, EngineConfig(forward="cpu", attention_backend="torch"))
    bf16 = random_model(0).to(torch.bfloat16)
    assert LLMEngine(bf16, EngineConfig()).runner.forward == "eager"
    with pytest.raises(ValueError, match="forward must be auto, eager or cpu"):
        EngineConfig(forward="fast")


def test_without_blas_or_compiler_auto_falls_back_and_cpu_says_why(small_model, monkeypatch, tmp_path):
    def no_gemm(dtype):
        raise RuntimeError("this PyTorch's libtorch_cpu does not export dgemm_ (no MKL BLAS to call from C)")

    monkeypatch.setattr(cpu_forward, "blas_gemm", no_gemm)
    assert LLMEngine(small_model, EngineConfig()).runner.forward == "eager"
    with pytest.raises(RuntimeError, match="does not export dgemm_"):
        LLMEngine(small_model, EngineConfig(forward="cpu"))
    monkeypatch.undo()

    monkeypatch.setenv("COURSE_LIB_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setattr(cpu_forward.KERNEL, "libraries", {})
    monkeypatch.setattr(cpu_forward.KERNEL, "error", None)
    ok, why = cpu_forward.available(torch.float64)
    assert not ok and "the cpu forward is unavailable: no C compiler" in why


def test_auto_attends_long_prefill_steps_eagerly(monkeypatch):
    """Steps mixing both forwards write the same caches: the tokens stay the plain model's."""
    from course_lib import runner

    model = random_model(6)
    prompts = random_prompts(4, model.config.vocab_size, lo=20, hi=40, seed=6)
    expected = [model.generate(p, 8, stop_token_ids=[]) for p in prompts]
    heads = model.config.num_heads * model.config.head_dim
    monkeypatch.setattr(runner, "EAGER_PREFILL_WORK", 300 * heads)  # a 20-token prompt already needs 210 pairs
    config = EngineConfig(max_num_batched_tokens=32, page_size=4)
    auto = LLMEngine(model, config)
    assert [o.token_ids for o in auto.generate(prompts, SamplingParams(max_tokens=8))] == expected
    assert auto.runner.forward == "cpu" and min(auto.runner.steps_by_forward.values()) > 0
    forced = LLMEngine(model, EngineConfig(max_num_batched_tokens=32, page_size=4, forward="cpu"))
    assert [o.token_ids for o in forced.generate(prompts, SamplingParams(max_tokens=8))] == expected
    assert forced.runner.steps_by_forward["eager"] == 0


def test_bench_forward_is_well_formed():
    cases = [("one decode", "tiny", [(5, 1)]), ("two prompts", "tiny", [(0, 6), (3, 4)])]
    result = bench_forward(cases, repeats=1)
    assert [r["case"] for r in result["cases"]] == ["one decode", "two prompts"]
    for r in result["cases"]:
        assert r["c_ms"] > 0 and r["eager_ms"] > 0 and r["ratio"] == pytest.approx(r["c_ms"] / r["eager_ms"])
        assert r["max_logit_diff"] < 1e-3  # float32: the two forwards agree
    assert [r["tokens"] for r in result["cases"]] == [1, 10]
    assert "C / eager" in format_table(result)


def test_attention_split_over_threads_equals_one_thread(monkeypatch):
    from course_lib.attention import cpu_decode

    model = model_with()
    caches, batch, _ = make_step(model, [(9, 1), (30, 1), (0, 12), (17, 5)], page_size=4)
    L = model.config.num_layers

    def run(threads):
        ours = [c.clone() for c in caches]
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return CpuForward(model, ours[:L], ours[L:])(**batch), ours
        finally:
            torch.set_num_threads(old)

    one, one_caches = run(1)
    monkeypatch.setattr(cpu_decode, "PARALLEL_MIN_WORK", 1)  # split even this small step
    for threads in (2, 3):
        many, many_caches = run(threads)
        assert torch.equal(one, many)  # rows are independent: the same numbers, bit for bit
        assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(one_caches, many_caches))


def test_weights_swapped_for_another_shape_or_dtype_are_refused():
    model = random_model(7)
    engine = LLMEngine(model, EngineConfig(forward="cpu"))
    model.layers[1].down_proj = torch.nn.Parameter(torch.zeros(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"down_proj as a contiguous CPU torch.float64 tensor of shape \[48, 96\]"):
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    model = random_model(7)
    engine = LLMEngine(model, EngineConfig(forward="cpu"))
    model.lm_head.weight.data = model.lm_head.weight.data.float()
    with pytest.raises(ValueError, match="lm_head as a contiguous CPU torch.float64 tensor"):
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
