"""What the engine benchmarks run on: the tiny model (or random weights of its shape), and the
machine's load average to print beside their numbers."""
from __future__ import annotations

import os

import torch

from ..model.random_init import random_model
from ..model.transformer import Transformer

# The shape of the shipped tiny model (scripts/train_tiny.py defaults, CharTokenizer vocabulary).
TINY_SHAPE = dict(vocab_size=47, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                  num_kv_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> Transformer:
    """A random model with the tiny model's shape. Weights are drawn like a trained model's scale
    (unit-scale activations, `init="unit"`), so float32 logits are realistic and greedy near-ties rare."""
    return random_model(seed, init="unit", dtype=dtype, **{**TINY_SHAPE, **overrides})


def load_model(kind: str = "tiny", seed: int = 0):
    """(model, tokenizer or None, the kind really used). "tiny" falls back to "random" (same shape)
    when the tiny model's weights are not installed."""
    if kind not in ("tiny", "random"):
        raise ValueError(f"model must be 'tiny' or 'random', got {kind!r}")
    if kind == "tiny":
        try:
            from ..model.tiny import load_tiny

            model, tokenizer = load_tiny()
            return model.float().eval(), tokenizer, "tiny"
        except (ImportError, FileNotFoundError):
            pass
    return random_tiny_model(seed), None, "random"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): a crowded machine
    moves every timing."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None
