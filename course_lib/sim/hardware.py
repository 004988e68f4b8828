"""Named GPUs and model shapes: the numbers the roofline cost model needs, nothing else.

GPU figures are the vendor's published peaks (dense, no structured sparsity). Real kernels
reach perhaps 50-80% of them; the simulator uses the peaks as they are, so simulated times
are optimistic lower bounds with the right *shape* (which resource binds, how it scales).
"""
from __future__ import annotations

from dataclasses import dataclass

from course_lib.model.kv_footprint import kv_bytes_per_token

GiB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_flops: float  # dense bf16 (or fp16 where the chip has no bf16) tensor-core FLOP/s
    mem_bandwidth: float  # HBM / GDDR bytes per second
    memory_bytes: float  # nominal device memory

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where compute time equals memory time: below it a step is memory-bound."""
        return self.peak_flops / self.mem_bandwidth


# Sources: NVIDIA datasheets. Tensor-core peaks are quoted "with sparsity" as 2x these.
GPUS: dict[str, GPUSpec] = {
    # H100 SXM5 80GB: 989.4 TFLOPS bf16 dense, 3.35 TB/s HBM3.
    "H100": GPUSpec("H100", 989e12, 3.35e12, 80 * GiB),
    # H200 SXM 141GB: same compute die as H100 (989 TFLOPS), 4.8 TB/s HBM3e.
    "H200": GPUSpec("H200", 989e12, 4.8e12, 141 * GiB),
    # A100 SXM4 80GB: 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e.
    "A100": GPUSpec("A100", 312e12, 2.039e12, 80 * GiB),
    # L4 24GB: 121 TFLOPS bf16 dense (242 sparse), 300 GB/s GDDR6.
    "L4": GPUSpec("L4", 121e12, 300e9, 24 * GiB),
    # T4 16GB: 65 TFLOPS fp16 mixed precision (Turing has no bf16), 320 GB/s GDDR6.
    "T4": GPUSpec("T4", 65e12, 320e9, 16 * GiB),
}


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """A GPU by name, case-insensitive (`"h100"`, `"A100"`, ...); a GPUSpec passes through."""
    if isinstance(name, GPUSpec):
        return name
    for key, spec in GPUS.items():
        if key.lower() == str(name).lower():
            return spec
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")


@dataclass(frozen=True)
class ModelShape:
    """How big a model is, as the cost model sees it: parameters, layers, attention geometry."""

    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int = 2  # bf16 weights
    kv_bytes_per_elem: int = 2  # bf16 KV cache

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: what one cached token costs in memory (the one formula,
        course_lib.model.kv_footprint's, which reads the same three fields off a shape as off a config)."""
        return kv_bytes_per_token(self, self.kv_bytes_per_elem)

    def max_kv_tokens(self, gpu: GPUSpec, memory_fraction: float = 0.9) -> int:
        """Tokens of KV that fit beside the weights in `memory_fraction` of the GPU's memory."""
        free = gpu.memory_bytes * memory_fraction - self.weight_bytes
        return max(0, int(free // self.kv_bytes_per_token))

    @classmethod
    def from_config(cls, cfg, name: str = "tiny", bytes_per_param: int = 2, kv_bytes_per_elem: int = 2) -> "ModelShape":
        """The shape of a course_lib `ModelConfig` (parameter count computed from it)."""
        return cls(
            name=name,
            num_params=float(count_params(cfg)),
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            bytes_per_param=bytes_per_param,
            kv_bytes_per_elem=kv_bytes_per_elem,
        )


def count_params(cfg) -> int:
    """Parameters of a Llama-family decoder described by a `ModelConfig`."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * hd, cfg.num_kv_heads * hd
    attention = h * q_out + 2 * h * kv_out + q_out * h
    if getattr(cfg, "attention_bias", False):
        attention += q_out + 2 * kv_out
    mlp = 3 * h * cfg.intermediate_size  # gate, up, down
    norms = 2 * h  # before attention and before the MLP
    embeddings = cfg.vocab_size * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return cfg.num_layers * (attention + mlp + norms) + h + embeddings  # + final norm


# Published architectures (config.json of each checkpoint; parameter counts from the model cards).
MODEL_SHAPES: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape("llama-3-8b", 8.03e9, 32, 4096, 32, 8, 128),
    "llama-3-70b": ModelShape("llama-3-70b", 70.6e9, 80, 8192, 64, 8, 128),
    "qwen2-0.5b": ModelShape("qwen2-0.5b", 0.494e9, 24, 896, 14, 2, 64),
}


def get_model_shape(name: str | ModelShape) -> ModelShape:
    """A model shape by name; `"tiny"` reads the shipped tiny model's config (lazily)."""
    if isinstance(name, ModelShape):
        return name
    key = str(name).lower()
    if key in MODEL_SHAPES:
        return MODEL_SHAPES[key]
    if key == "tiny":
        return _tiny_shape()
    raise ValueError(f"unknown model shape {name!r}; known: tiny, {', '.join(MODEL_SHAPES)}")


def _tiny_shape() -> ModelShape:
    # Imported here: the tiny model's files belong to the model package and may be absent in
    # a partial checkout; only callers that ask for "tiny" should need them.
    from pathlib import Path

    from course_lib.model.config import ModelConfig
    import course_lib.model as model_pkg

    path = Path(model_pkg.__file__).parent / "tiny" / "config.json"
    if not path.exists():
        raise ValueError(f"the tiny model's config is not at {path}; build a ModelShape with ModelShape.from_config")
    return ModelShape.from_config(ModelConfig.load(path), name="tiny")
