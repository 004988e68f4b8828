"""Random models for tests, graders and benchmarks: one factory, deterministic, side-effect free.

Every model is drawn from its own seeded generators, inside `torch.random.fork_rng`, so the
caller's global RNG state is left alone (a grader must not change a student's random state)
and the same seed always gives the same weights, whatever ran before.

Two initialisations:

- "spread" (the default): every matrix ~ N(0, 0.3^2), norms at 1. Logits spread out, so greedy
  near-ties are practically impossible and, in float64, every engine configuration reproduces
  the dense model's greedy tokens exactly: parity is an equality.
- "unit": matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights ~ 1 + N(0, 0.1^2):
  unit-scale activations, like a trained model, for float32 speed comparisons.
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .transformer import Transformer

# GQA (4 query heads share 2 KV heads) so that head grouping mistakes change the tokens.
SMALL_SHAPE = dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, max_position_embeddings=64, eos_token_id=None)
INITS = ("spread", "unit")


def random_model(seed: int = 0, *, init: str = "spread", dtype: torch.dtype = torch.float64,
                 **config) -> Transformer:
    """A random Llama-family model in eval mode. `config` overrides `SMALL_SHAPE` (any
    `ModelConfig` field); with `eos_token_id=None` (the default) output lengths are exactly
    max_tokens. Weights are drawn in float64 and then cast to `dtype`."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10_000 + seed)
        model = Transformer(ModelConfig(**{**SMALL_SHAPE, **config}))
    model = model.to(torch.float64).eval()
    gen = torch.Generator().manual_seed(20_000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if init == "spread":
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[1] ** 0.5)
    return model.to(dtype)
