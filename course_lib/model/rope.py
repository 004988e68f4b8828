"""Rotary position embeddings, computed the way Hugging Face computes them.

The angles are computed in float32 and only then cast to the model's dtype. That looks
odd for a float64 model, but it is what `transformers` does, and matching it bit for bit is
what lets our parity tests demand 1e-9 agreement.
"""
from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, rope_scaling: dict | None = None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "llama3":
        return _llama3_scaled(inv_freq, rope_scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, llama3")


def _llama3_scaled(inv_freq: torch.Tensor, cfg: dict) -> torch.Tensor:
    # Llama 3.1 stretches low frequencies (long wavelengths) and keeps high ones, blending between.
    factor = cfg["factor"]
    low_freq_factor = cfg["low_freq_factor"]
    high_freq_factor = cfg["high_freq_factor"]
    old_len = cfg["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """(cos, signed_sin), each [num_tokens, 1, head_dim] (broadcast over heads), for the given
    absolute positions, ready for `apply_rope`. signed_sin is sin with its first half negated:
    see `apply_rope`."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    sin[:, : freqs.shape[1]].neg_()
    return emb.cos().to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The textbook form: (x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; cos, signed_sin: [num_tokens, 1, head_dim] from `rope_cos_sin`.

    Equals `x * cos + rotate_half(x) * sin` bit for bit (HF's formula): rolling x by half a head
    swaps its halves, and the sign that rotate_half puts on x2 rides on sin instead, which is
    exact in floating point. One roll replaces two slices, a negation and a concatenation: this
    runs twice per layer per step, and at small batches the cost is the number of ops."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
