"""A Llama-family decoder you can read top to bottom.

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU. The model works on a *flat*
batch: `input_ids` and `positions` are 1-D over every token of every sequence in the step.
It never owns a KV cache. Each attention layer hands its fresh queries, keys and values to
an `attend(layer, q, k, v)` callable, which decides where keys and values are stored
(nowhere, a contiguous buffer, a paged pool) and which earlier tokens each query sees.
That one seam is how the engine plugs in paged KV memory without touching this file.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .rope import apply_rope, inverse_frequencies, rope_cos_sin


class Attend(Protocol):
    """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] -> [T, num_heads, head_dim].

    q, k and v are views into one fused projection (see DecoderLayer), so they are strided, not
    contiguous: split or merge their token dimension with `view`/`reshape` as usual, but do not
    assume `q.is_contiguous()`."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension.

    Normalised in float32 (half precision overflows in the square). HF does this even for a
    float64 model, so we do too: that is what makes float64 parity with transformers exact.
    (The dtype checks skip two no-op casts: at small batches every op's overhead counts.)"""
    h = x if x.dtype == torch.float32 else x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if x.dtype == torch.float32 else h.to(x.dtype))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """One block: x += attention(rms_norm(x)); x += swiglu(rms_norm(x)).

    Two choices here are about speed, and both are what serving engines do:

    - **Fused projections.** q, k and v are one [(H + 2 KV) * D, hidden] matrix, gate and up one
      [2 * intermediate, hidden] matrix (vLLM's QKVParallelLinear and MergedColumnParallelLinear):
      one matmul instead of three, and one instead of two, and RoPE turns the q and k heads in
      one go. `model.weights` converts to and from Hugging Face's separate matrices.
    - **Weights as plain parameters, the forward as plain functions**, not a tree of nn.Linear
      submodules. In a decode step each sequence brings one token, so a matmul is a few
      microseconds, and calling a submodule costs about as much again; the tiny model made ~50
      such calls per step. Together these cut a one-token forward pass (attention aside) by about
      30% here (docs/engine_benchmark.md); the outputs are bit-identical."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.eps = layer, cfg.rms_norm_eps
        H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.heads = (H, KV, D)
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        self.input_norm = nn.Parameter(torch.ones(hidden))
        self.qkv_proj = nn.Parameter(torch.empty((H + 2 * KV) * D, hidden))
        bias = nn.Parameter(torch.zeros((H + 2 * KV) * D)) if cfg.attention_bias else None
        self.register_parameter("qkv_bias", bias)  # None is registered too: forward reads _parameters
        self.o_proj = nn.Parameter(torch.empty(hidden, H * D))
        self.post_attention_norm = nn.Parameter(torch.ones(hidden))
        self.gate_up_proj = nn.Parameter(torch.empty(2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(hidden, inter))
        for w in (self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's default; loaders overwrite it

    def forward(self, x, cos, sin, attend: Attend):
        # Parameters read from the module's own dict: `self.qkv_proj` would go through
        # nn.Module.__getattr__, a Python function called for each of the 7 weights, every layer.
        w, eps = self._parameters, self.eps
        T, (H, KV, D) = x.shape[0], self.heads
        qkv = F.linear(rms_norm(x, w["input_norm"], eps), w["qkv_proj"], w["qkv_bias"]).view(T, H + 2 * KV, D)
        qk = apply_rope(qkv[:, : H + KV], cos, sin)  # the q heads, then the k heads
        out = attend(self.layer, qk[:, :H], qk[:, H:], qkv[:, H + KV :])
        x = x + F.linear(out.reshape(T, H * D), w["o_proj"])
        gate, up = F.linear(rms_norm(x, w["post_attention_norm"], eps), w["gate_up_proj"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w["down_proj"])


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # Kept in float32 whatever the model dtype (see rope.py); not a parameter, not saved.
        self.register_buffer(
            "inv_freq", inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), persistent=False
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def _apply(self, fn, *args, **kwargs):
        # `.to(float64)` must not touch the float32 rotary frequencies (HF keeps them float32 too).
        inv_freq = self.inv_freq
        out = super()._apply(fn, *args, **kwargs)
        self.inv_freq = inv_freq.to(self.embed_tokens.weight.device, torch.float32)
        return out

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for a flat batch: [T, vocab], or only the rows in `logits_indices`."""
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer.forward(x, cos, sin, attend)  # .forward: no hooks to run, so skip nn.Module's call machinery
        if logits_indices is not None:
            x = x[logits_indices]
        return self.lm_head(self.norm(x))

    # ------------------------------------------------------------------ the plain reference
    @torch.inference_mode()
    def dense_logits(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """Logits of every position of every sequence, no cache at all: the ground truth."""
        lens = [len(s) for s in sequences]
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        logits = self(ids, positions, DenseCausalAttention(lens))
        return list(logits.split(lens))

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_tokens: int, stop_token_ids=None) -> list[int]:
        """Greedy decoding by re-running the whole sequence each step: slow, simple, the reference
        that every engine configuration must match token for token."""
        stop = set(self.config.eos_token_ids if stop_token_ids is None else stop_token_ids)
        seq, out = list(prompt_ids), []
        for _ in range(max_tokens):
            token = int(self.dense_logits([seq])[0][-1].argmax())
            out.append(token)
            seq.append(token)
            if token in stop:
                break
        return out


class DenseCausalAttention:
    """Attention over a flat batch of whole sequences, each attending causally to itself only."""

    def __init__(self, seq_lens: list[int]):
        self.seq_lens = seq_lens

    def __call__(self, layer, q, k, v):
        outs = []
        for qs, ks, vs in zip(q.split(self.seq_lens), k.split(self.seq_lens), v.split(self.seq_lens)):
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True, enable_gqa=True
            )
            outs.append(o.transpose(0, 1))
        return torch.cat(outs)
