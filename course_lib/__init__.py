"""course_lib: a small but real LLM serving engine (continuous batching + PagedAttention).

Names are imported lazily so that `import course_lib` stays fast and never needs
`transformers` (only `from_hf` / `load_hf` do).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "course_lib.model.config",
    "Transformer": "course_lib.model.transformer",
    "CharTokenizer": "course_lib.model.tokenizer",
    "load_tiny": "course_lib.model.tiny",
    "from_hf": "course_lib.model.hf",
    "load_hf": "course_lib.model.hf",
    "SamplingParams": "course_lib.scheduler.sampling",
    "EngineConfig": "course_lib.engine_config",
    "LLMEngine": "course_lib.engine",
    "RequestOutput": "course_lib.request_output",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__"]
