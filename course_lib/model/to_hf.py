"""Export our Transformer to a Hugging Face `transformers` model: the inverse of `from_hf`.

The benchmark serves the *same weights* through course_lib and through `transformers`
(`generate_batch`, padded `generate`), so that throughput is compared on equal work and the
greedy tokens can be compared one by one. A model without biases becomes a
`LlamaForCausalLM`, a model with q/k/v biases a `Qwen2ForCausalLM` (Llama's `attention_bias`
would also put a bias on o_proj, which our attention does not have).

`transformers` is imported inside `to_hf` only, so importing this module never needs it.
Weights are copied (the HF model owns its tensors), in the model's dtype and on its device.
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .weights import to_hf_names


def hf_config_of(cfg: ModelConfig, attn_implementation: str = "sdpa"):
    """A `LlamaConfig` (or `Qwen2Config` when the model has q/k/v biases) describing `cfg`."""
    import transformers

    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling:
        rope = {**{k: v for k, v in cfg.rope_scaling.items() if k != "type"}, "rope_theta": float(cfg.rope_theta)}
        rope.setdefault("rope_type", cfg.rope_scaling.get("type", "default"))
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters=rope,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )
    if cfg.attention_bias:
        hf_cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
        hf_cfg.head_dim = cfg.head_dim  # Qwen2 has no head_dim argument; its attention reads the attribute
        arch = "Qwen2ForCausalLM"
    else:
        hf_cfg = transformers.LlamaConfig(**common, head_dim=cfg.head_dim, attention_bias=False, mlp_bias=False)
        arch = "LlamaForCausalLM"
    hf_cfg.architectures = [arch]
    hf_cfg._attn_implementation = attn_implementation
    return hf_cfg


@torch.no_grad()
def to_hf(model, attn_implementation: str = "sdpa"):
    """A `transformers` causal LM computing the same logits as our `model` (same dtype, device).

    `attn_implementation`: "sdpa" (the default; stays in the model's dtype, so float64 parity
    is exact) or "eager" (which upcasts the softmax to float32)."""
    import transformers

    cfg: ModelConfig = model.config
    hf_cfg = hf_config_of(cfg, attn_implementation)
    cls = transformers.Qwen2ForCausalLM if cfg.attention_bias else transformers.LlamaForCausalLM
    with torch.device("meta"):
        hf = cls(hf_cfg)
    ours = to_hf_names(model.state_dict(), cfg)  # HF names without the "model." prefix
    state = {}
    for name in hf.state_dict():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        src = name.removeprefix("model.")
        if src not in ours:
            raise ValueError(f"{cls.__name__} wants weight {name!r} but the course_lib model has no {src!r}")
        state[name] = ours[src].detach().clone()
    missing = set(ours) - {n.removeprefix("model.") for n in state}
    if cfg.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"course_lib weights with no place in {cls.__name__}: {sorted(missing)[:6]}")
    hf.load_state_dict(state, assign=True, strict=False)
    if cfg.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    # Non-persistent buffers (the rotary frequencies) are still on the meta device: build them anew.
    hf.model.rotary_emb = type(hf.model.rotary_emb)(hf_cfg).to(model.device)
    hf.generation_config.eos_token_id = cfg.eos_token_id
    hf.generation_config.pad_token_id = cfg.pad_token_id
    hf.generation_config.bos_token_id = cfg.bos_token_id
    for p in hf.parameters():
        if p.device.type == "meta":
            raise ValueError("to_hf left a weight on the meta device (bug)")
    return hf.eval()
