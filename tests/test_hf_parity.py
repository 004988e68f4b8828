"""Our Transformer equals Hugging Face `transformers` on the same weights, in float64 on CPU.

No downloads: every HF model is built from a config object with a fixed seed, and then every
parameter (norm weights and biases included, which HF initialises to 1 and 0) is redrawn so
that a weight we forgot to copy, or copied into the wrong place, changes the logits.
"""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")  # only for installs without the [hf] extra

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from course_lib.model.hf import config_from_hf, from_hf, load_hf  # noqa: E402
from course_lib.model.rope import inverse_frequencies  # noqa: E402

TOL = 1e-9
VOCAB = 97
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    # Qwen2: q/k/v biases always, and the usual small-Qwen tied embeddings.
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
}
ATTENTION = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}  # (num_heads, num_kv_heads)
PROMPT_LENGTHS = (1, 7, 33)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread is faster, and kinder to a shared CPU, than a contended pool."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_hf(
    family: str,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    hidden: int = 32,
    head_dim: int | None = None,
    layers: int = 2,
    intermediate: int = 48,
    seed: int = 0,
    **overrides,
):
    config_cls, model_cls, family_kwargs = FAMILIES[family]
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="sdpa",  # eager upcasts softmax to float32; sdpa stays float64
    )
    kwargs.update(family_kwargs)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = model_cls(config_cls(**kwargs)).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
            else:  # projections: unit-scale activations, so attention is far from uniform
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[1] ** 0.5)
    return hf


def prompt(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(1000 + seed)).tolist()


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def max_logit_diff(hf, model, lengths) -> float:
    prompts = [prompt(n, i) for i, n in enumerate(lengths)]
    ours = model.dense_logits(prompts)  # one flat batch of all prompts: exercises the packing too
    return max(float((hf_logits(hf, p) - o).abs().max()) for p, o in zip(prompts, ours))


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    hf.generation_config.eos_token_id = None  # never stop early (min_new_tokens would mask eos logits)
    x = torch.tensor([ids])
    with torch.no_grad():
        # An explicit all-ones mask: left alone, generate() masks out every prompt token equal to pad.
        out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0)
    generated = out[0, len(ids):].tolist()
    assert len(generated) == n
    return generated


# --------------------------------------------------------------------------- (a) logits
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf(family, attention):
    heads, kv_heads = ATTENTION[attention]
    hf = make_hf(family, heads=heads, kv_heads=kv_heads)
    model = from_hf(hf)
    assert model.config.num_kv_heads == kv_heads
    assert model.config.attention_bias == (family == "qwen2")
    assert model.config.tie_word_embeddings == (family == "qwen2")
    assert max_logit_diff(hf, model, PROMPT_LENGTHS) <= TOL


# --------------------------------------------------------------------------- (b) greedy tokens
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_hf(family, attention):
    heads, kv_heads = ATTENTION[attention]
    hf = make_hf(family, heads=heads, kv_heads=kv_heads, seed=1)
    model = from_hf(hf)
    for length in (1, 7, 20):
        ids = prompt(length, seed=length)
        # eos (id 2) is *not* a stop token on either side: all 8 tokens are compared.
        assert model.generate(ids, 8, stop_token_ids=[]) == hf_greedy(hf, ids, 8)


# --------------------------------------------------------------------------- (c) random shapes
@st.composite
def shapes(draw):
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    return dict(
        family=draw(st.sampled_from(sorted(FAMILIES))),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([2, 4, 6, 8, 16])),
        hidden=heads * draw(st.integers(1, 8)),  # HF insists on a multiple of heads, even with head_dim set
        intermediate=draw(st.integers(1, 24)) * 4,
        layers=draw(st.integers(1, 3)),
        rope_theta=draw(st.floats(100.0, 1e6)),
        seed=draw(st.integers(0, 2**16)),
        length=draw(st.integers(1, 40)),
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes())
def test_random_shapes_match_hf(shape):
    length = shape.pop("length")
    hf = make_hf(**shape)
    model = from_hf(hf)
    assert model.config.head_dim == shape["head_dim"]
    assert model.config.rope_theta == pytest.approx(shape["rope_theta"])
    assert max_logit_diff(hf, model, [length]) <= TOL


# --------------------------------------------------------------------------- (d) llama3 rope
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that at head_dim 16 and theta 5e5 the three bands all occur (kept, smoothed, divided by 8).
    "original_max_position_embeddings": 64,
}


def test_llama3_rope_scaling_matches_hf():
    hf = make_hf("llama", heads=4, kv_heads=2, hidden=64, head_dim=16, rope_theta=500000.0, rope_scaling=dict(LLAMA3))
    model = from_hf(hf)
    assert model.config.rope_scaling == LLAMA3
    assert model.config.rope_theta == 500000.0
    # The scaling really changes the frequencies (low ones divided by 8, some smoothed, some kept).
    default = inverse_frequencies(16, 500000.0)
    ratio = default / model.inv_freq
    assert ratio.min() == 1.0 and ratio.max() == 8.0 and ((ratio > 1) & (ratio < 8)).any()
    assert max_logit_diff(hf, model, (1, 7, 33, 90)) <= TOL
    ids = prompt(30)
    assert model.generate(ids, 6, stop_token_ids=[]) == hf_greedy(hf, ids, 6)


# --------------------------------------------------------------------------- sliding window
def test_sliding_window_allowed_only_where_it_never_applies():
    hf = make_hf("mistral", sliding_window=16)
    with pytest.raises(ValueError, match=r"sliding-window attention \(window 16.*max_model_len<=16"):
        from_hf(hf)
    model = from_hf(hf, max_model_len=16)
    assert model.config.max_position_embeddings == 16
    assert max_logit_diff(hf, model, (1, 9, 16)) <= TOL


def test_qwen2_sliding_window_only_counts_when_enabled():
    assert config_from_hf(make_hf("qwen2", use_sliding_window=False, sliding_window=8).config).extra["sliding_window"] is None
    with pytest.raises(ValueError, match="sliding-window"):
        from_hf(make_hf("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0))


# --------------------------------------------------------------------------- (e) unsupported
def test_unsupported_architecture_names_class_and_supported_ones():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16))
    with pytest.raises(ValueError, match=r"unsupported architecture GPT2LMHeadModel.*LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM"):
        from_hf(gpt2)
    with pytest.raises(ValueError, match="unsupported architecture LlamaModel"):
        from_hf(make_hf("llama").model)  # the body without lm_head


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope type 'linear' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn' is not supported"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"attention_bias": True}, "o_proj bias"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_unsupported_features_raise(overrides, message):
    hf = make_hf("llama", **overrides)
    with pytest.raises(ValueError, match=message):
        from_hf(hf)


# --------------------------------------------------------------------------- the import itself
def test_weights_are_shared_or_fused_and_keep_the_dtype():
    hf = make_hf("qwen2")
    model = from_hf(hf)
    assert model.dtype == torch.float64 and model.inv_freq.dtype == torch.float32
    # One HF matrix becomes one of ours: shared. q/k/v and gate/up become one fused matrix: copied.
    layer, theirs = model.layers[1], hf.model.layers[1]
    assert layer.o_proj.data_ptr() == theirs.self_attn.o_proj.weight.data_ptr()
    assert layer.down_proj.data_ptr() == theirs.mlp.down_proj.weight.data_ptr()
    q, k, v = (theirs.self_attn.q_proj, theirs.self_attn.k_proj, theirs.self_attn.v_proj)
    assert torch.equal(layer.qkv_proj, torch.cat([q.weight, k.weight, v.weight]))
    assert torch.equal(layer.qkv_bias, torch.cat([q.bias, k.bias, v.bias]))
    assert torch.equal(layer.gate_up_proj, torch.cat([theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight]))
    assert model.lm_head.weight is model.embed_tokens.weight
    cfg = model.config
    assert (cfg.vocab_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (VOCAB, 2, 4, 2, 8)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    hf32 = make_hf("llama").to(torch.float32)
    assert from_hf(hf32).dtype == torch.float32


def test_the_parity_check_can_fail():
    """A check that cannot fail is a defect: break one thing at a time and watch it notice."""
    hf = make_hf("qwen2", kv_heads=1)
    for breakage in ("bias", "norm", "theta"):
        model = from_hf(make_hf("qwen2", kv_heads=1))  # its own copy of the weights to break
        with torch.no_grad():
            if breakage == "bias":
                cfg = model.config
                model.layers[0].qkv_bias[: cfg.num_heads * cfg.head_dim].zero_()  # the q part
            elif breakage == "norm":
                model.layers[1].post_attention_norm[0] += 0.01
            else:
                model.inv_freq = inverse_frequencies(model.config.head_dim, 20000.0)
        assert max_logit_diff(hf, model, (7,)) > 1e-6, breakage


def test_config_reads_transformers4_spellings():
    old = SimpleNamespace(
        model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=None, rms_norm_eps=1e-5, max_position_embeddings=64,
        rope_theta=500000.0, rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0},
        eos_token_id=[7], bos_token_id=6, pad_token_id=None, tie_word_embeddings=False,
    )
    cfg = config_from_hf(old, architecture="LlamaForCausalLM")
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 8 and cfg.rope_theta == 500000.0 and cfg.eos_token_id == 7
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_load_hf_from_a_local_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = make_hf("llama")
    hf.save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(tmp_path)

    model, tokenizer = load_hf(str(tmp_path), dtype=torch.float64)
    ids = tokenizer("w5 w17 w3 w42")["input_ids"]
    assert ids == [5, 17, 3, 42]
    assert model.dtype == torch.float64
    assert max_logit_diff(hf, model, (len(ids),)) <= TOL


def test_missing_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ImportError, match=r'pip install "llm-serving-course\[hf\]"'):
        load_hf("anything")


def test_importing_course_lib_does_not_import_transformers():
    code = "import sys, course_lib, course_lib.model.hf; course_lib.from_hf; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
