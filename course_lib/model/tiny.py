"""The tiny model shipped inside the package: a ~1M-parameter Llama trained on toy tasks.

`load_tiny()` gives `(model, tokenizer)`, ready to serve. See docs/tiny_model.md for what it
was trained on and how well it does; scripts/train_tiny.py rebuilds it from a seed.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ModelConfig
from .tokenizer import CharTokenizer
from .transformer import Transformer
from .weights import from_hf_names

TINY_DIR = Path(__file__).resolve().parent / "tiny"


def load_tiny(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> tuple[Transformer, CharTokenizer]:
    """The shipped tiny model (in eval mode, on `device`, in `dtype`) and its tokenizer."""
    missing = [f for f in ("config.json", "tokenizer.json", "model.safetensors") if not (TINY_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"tiny model files missing from {TINY_DIR}: {', '.join(missing)}; "
            "rebuild them with `python scripts/train_tiny.py`"
        )
    cfg = ModelConfig.load(TINY_DIR / "config.json")
    tokenizer = CharTokenizer.load(TINY_DIR / "tokenizer.json")
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(
            f"tokenizer vocab_size {tokenizer.vocab_size} does not match the model's vocab_size {cfg.vocab_size}"
        )
    model = Transformer(cfg)
    state, _ = from_hf_names(load_file(str(TINY_DIR / "model.safetensors")), cfg)  # stored in HF's names
    model.load_state_dict(state, strict=True)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, tokenizer
