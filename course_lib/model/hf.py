"""Import a Hugging Face Llama / Qwen2 / Mistral checkpoint into our Transformer.

The three families share one architecture (RMSNorm, RoPE, GQA, SwiGLU) and, in
`transformers`, the same parameter names, so the import is a renaming: `model.layers.3.mlp...`
becomes `layers.3.mlp...`. What differs is read from the HF config: Qwen2 always puts biases
on q, k and v; some checkpoints tie the output head to the embedding; Llama 3.1 rescales its
rotary frequencies; Mistral v0.1 and some Qwen2 configs use sliding-window attention.
Anything we would compute differently from `transformers` raises a ValueError instead of
silently giving other logits.

`transformers` is an optional dependency: it is imported inside `load_hf` only, so
`import course_lib.model.hf` works without it. `from_hf` never imports it at all: it reads
the model and config objects it is given.
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .rope import inverse_frequencies
from .transformer import Transformer
from .weights import from_hf_names

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_INSTALL_HINT = 'pip install "llm-serving-course[hf]"'


# --------------------------------------------------------------------------- public functions
def from_hf(hf_model, *, max_model_len: int | None = None) -> Transformer:
    """Our Transformer with the weights of `hf_model` (same dtype/device). Weights are shared with
    it, not copied, except the fused q/k/v and gate/up matrices (see `model.weights`).

    `max_model_len` caps the sequence length the converted model is meant for (it becomes
    `config.max_position_embeddings`). It only matters for sliding-window models: their window
    must not be shorter than the lengths served, because we always attend to the full context.
    """
    architecture = _architecture(hf_model)
    cfg = config_from_hf(hf_model.config, architecture=architecture, max_model_len=max_model_len)
    gen_cfg = getattr(hf_model, "generation_config", None)
    if gen_cfg is not None and getattr(gen_cfg, "eos_token_id", None) is not None:
        # What HF's generate() stops on (Llama 3 instruct lists several eos ids only there).
        cfg.eos_token_id = _int_or_list(gen_cfg.eos_token_id)

    hf_state = hf_model.state_dict()
    embed = hf_state["model.embed_tokens.weight"]
    head = hf_state.get("lm_head.weight")
    # Tie when HF really computes with one matrix for both (what the model does, not what it says).
    cfg.tie_word_embeddings = head is None or _same_storage(head, embed)

    # HF names without LlamaForCausalLM's "model." prefix, the names model.weights speaks.
    named = {n.removeprefix("model."): t.detach() for n, t in hf_state.items() if not n.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        named["lm_head.weight"] = named["embed_tokens.weight"]
    try:
        state, used = from_hf_names(named, cfg)
    except KeyError as missing:
        raise ValueError(f"{architecture}: weight {_full_name(missing.args[0])!r} is missing from the Hugging Face "
                         "model") from None
    unused = {_full_name(n) for n in set(named) - used}
    if unused:
        raise ValueError(
            f"{architecture}: the Hugging Face model has weights course_lib does not use, so its outputs "
            f"would differ: {sorted(unused)[:6]}{' ...' if len(unused) > 6 else ''}"
        )
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, assign=True, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # The rotary frequencies are a non-persistent float32 buffer: rebuild it off the meta device.
    model.inv_freq = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(embed.device)
    return model.eval()


def load_hf(
    name_or_path: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    max_model_len: int | None = None,
):
    """(model, tokenizer) from a local folder (works offline) or a Hub name (needs internet)."""
    transformers = _import_transformers()
    major = int(transformers.__version__.split(".")[0])
    dtype_kwarg = {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, **dtype_kwarg)
    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
    model = from_hf(hf_model, max_model_len=max_model_len)
    model.config.extra["name_or_path"] = str(name_or_path)
    del hf_model  # we hold what we use (shared or fused copies); the rest of it can go
    return model.to(device), tokenizer


def config_from_hf(hf_config, *, architecture: str | None = None, max_model_len: int | None = None) -> ModelConfig:
    """A ModelConfig from a HF config object (transformers 4.x or 5.x spellings)."""
    if hasattr(hf_config, "get_text_config"):
        hf_config = hf_config.get_text_config()
    arch = architecture or (getattr(hf_config, "architectures", None) or ["?"])[0]
    model_type = getattr(hf_config, "model_type", None)
    _check_supported_features(hf_config, arch, model_type)

    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    theta, rope_scaling = _rope_from_hf(hf_config, arch)
    max_len = hf_config.max_position_embeddings
    window = _sliding_window(hf_config)
    if max_model_len is not None:
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {max_model_len}")
        max_len = min(max_len, max_model_len) if max_len else max_model_len
    if window is not None and max_len > window:
        raise ValueError(
            f"{arch}: sliding-window attention (window {window} tokens) is active for sequences longer "
            f"than {window} tokens, up to max_position_embeddings={max_len}; course_lib does not support "
            f"sliding windows (it always attends to the full context). Pass max_model_len<={window} to "
            f"from_hf/load_hf to serve only lengths where the window never applies."
        )
    attention_bias = model_type == "qwen2" or arch.startswith("Qwen2") or bool(getattr(hf_config, "attention_bias", False))
    return ModelConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        max_position_embeddings=int(max_len),
        attention_bias=attention_bias,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        bos_token_id=getattr(hf_config, "bos_token_id", None),
        eos_token_id=_int_or_list(getattr(hf_config, "eos_token_id", None)),
        pad_token_id=getattr(hf_config, "pad_token_id", None),
        extra={"hf_architecture": arch, "hf_model_type": model_type, "sliding_window": window},
    )


# --------------------------------------------------------------------------- helpers
def _import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"loading Hugging Face models needs the `transformers` package: {_INSTALL_HINT}") from e
    return transformers


def _architecture(hf_model) -> str:
    name = type(hf_model).__name__
    for cls in type(hf_model).__mro__:
        if cls.__name__ in SUPPORTED_ARCHITECTURES:
            return cls.__name__
    raise ValueError(
        f"unsupported architecture {name}: course_lib.from_hf supports {', '.join(SUPPORTED_ARCHITECTURES)} "
        f"(pass the *ForCausalLM model, with its lm_head)"
    )


def _check_supported_features(cfg, arch: str, model_type: str | None) -> None:
    def unsupported(what: str):
        raise ValueError(f"{arch}: {what} is not supported by course_lib")

    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        unsupported(f"hidden_act={act!r} (only silu/SwiGLU)")
    if getattr(cfg, "mlp_bias", False):
        unsupported("mlp_bias=True (biases on the MLP projections)")
    if model_type not in ("qwen2",) and not arch.startswith("Qwen2") and getattr(cfg, "attention_bias", False):
        # Llama's attention_bias also puts a bias on o_proj, which our attention does not have.
        unsupported("attention_bias=True on a Llama/Mistral model (it adds an o_proj bias)")
    if getattr(cfg, "quantization_config", None):
        unsupported("a quantized checkpoint (quantization_config is set); load it unquantized")


def _rope_from_hf(cfg, arch: str) -> tuple[float, dict | None]:
    """rope_theta and our rope_scaling dict, from `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (transformers 4)."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        # Nested per layer type (e.g. {"full_attention": {...}}): fine if every layer type agrees.
        variants = list(params.values())
        if any(v != variants[0] for v in variants[1:]):
            raise ValueError(f"{arch}: different rope parameters per layer type are not supported by course_lib")
        params = dict(variants[0])
    old_scaling = dict(getattr(cfg, "rope_scaling", None) or {})
    merged = {**old_scaling, **params}
    theta = merged.get("rope_theta", getattr(cfg, "rope_theta", None))
    theta = 10000.0 if theta is None else float(theta)
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    partial = merged.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{arch}: partial_rotary_factor={partial} (rotary on part of each head) is not supported by course_lib")
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        scaling = {"rope_type": "llama3"}
        for key in _LLAMA3_KEYS:
            value = merged.get(key)
            if value is None and key == "original_max_position_embeddings":
                value = cfg.max_position_embeddings  # HF's fallback
            if value is None:
                raise ValueError(f"{arch}: llama3 rope scaling is missing {key!r}")
            scaling[key] = value
        return theta, scaling
    raise ValueError(
        f"{arch}: rope type {rope_type!r} is not supported by course_lib (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
    )


def _sliding_window(cfg) -> int | None:
    """The attention window HF applies in at least one layer, or None."""
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    max_window_layers = getattr(cfg, "max_window_layers", None)  # Qwen2 in transformers 4
    if max_window_layers is not None and max_window_layers >= cfg.num_hidden_layers:
        return None
    return int(window)


def _int_or_list(value):
    if value is None or isinstance(value, int):
        return value
    values = [int(v) for v in value]
    return values[0] if len(values) == 1 else values


def _full_name(name: str) -> str:
    """A `model.weights` (HF-style) name as LlamaForCausalLM spells it: all but lm_head under "model."."""
    return name if name == "lm_head.weight" else "model." + name


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.device == b.device and a.data_ptr() == b.data_ptr())
