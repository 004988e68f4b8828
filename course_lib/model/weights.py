"""Our parameter names and Hugging Face's, and the conversion between them.

Hugging Face's Llama (and Qwen2, Mistral) keeps q, k, v, and gate, up, as separate matrices;
our `DecoderLayer` keeps each group as one matrix (why: see its docstring). Importing
concatenates them along the output dimension, exporting splits them; every other weight only
changes its name. HF names here are written without the "model." prefix that
`LlamaForCausalLM` puts on everything but `lm_head`; the shipped tiny model is stored in these
names, so any tool that reads a Llama checkpoint can read it.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from .config import ModelConfig

# Per layer: our name -> the HF names it is made of (in this order, concatenated on dim 0).
_LAYER_WEIGHTS = {
    "input_norm": ("input_layernorm.weight",),
    "qkv_proj": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "o_proj": ("self_attn.o_proj.weight",),
    "post_attention_norm": ("post_attention_layernorm.weight",),
    "gate_up_proj": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down_proj": ("mlp.down_proj.weight",),
}
_MODEL_WEIGHTS = ("embed_tokens.weight", "norm.weight", "lm_head.weight")  # same name on both sides


def _split_sizes(cfg: ModelConfig) -> dict[str, list[int]]:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv_proj": [q, kv, kv], "qkv_bias": [q, kv, kv], "gate_up_proj": [cfg.intermediate_size] * 2}


def _layer_weights(cfg: ModelConfig):
    for ours, theirs in _LAYER_WEIGHTS.items():
        if ours != "qkv_bias" or cfg.attention_bias:
            yield ours, theirs


def from_hf_names(hf: Mapping[str, torch.Tensor], cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], set[str]]:
    """(our state dict, the HF names it used) from HF-named weights. A weight made of one HF
    matrix is that very tensor (shared, not copied); fused ones are new tensors. Raises KeyError
    with the HF name of the first weight that is missing."""
    state, used = {}, set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return hf[name]

    for name in _MODEL_WEIGHTS:
        state[name] = take(name)
    for i in range(cfg.num_layers):
        for ours, theirs in _layer_weights(cfg):
            parts = [take(f"layers.{i}.{n}") for n in theirs]
            state[f"layers.{i}.{ours}"] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return state, used


def to_hf_names(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF-named weights (views into ours, not copies) from our state dict."""
    sizes = _split_sizes(cfg)
    out = {name: state[name] for name in _MODEL_WEIGHTS}
    for i in range(cfg.num_layers):
        for ours, theirs in _layer_weights(cfg):
            tensor = state[f"layers.{i}.{ours}"]
            parts = tensor.split(sizes[ours]) if len(theirs) > 1 else (tensor,)
            out.update((f"layers.{i}.{n}", p) for n, p in zip(theirs, parts))
    return out
