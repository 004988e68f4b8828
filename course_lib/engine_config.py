"""Every knob of the engine, each with a default that serves the tiny model well."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    page_size: int = 16
    num_pages: int | None = None  # None: room for max_num_seqs requests at half of max_model_len
    max_num_seqs: int = 64  # seats in the batch
    max_num_batched_tokens: int = 512  # tokens one forward pass may compute (the chunked-prefill budget)
    scheduler: str = "continuous"  # "continuous" (turnstile) or "static" (bus)
    kv_layout: str = "paged"  # "paged" or "contiguous" (max_model_len reserved per request)
    admission: str = "watermark"  # "none", "reserve" or "watermark"
    watermark: float = 0.05  # fraction of pages kept free when admitting (watermark policy)
    preemption: str = "recompute"  # "recompute", or "fail": a request that cannot grow ends in error
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    # "auto" (triton on CUDA; on CPUs the C kernel "cpu" when it builds, else torch), "torch",
    # "reference", "triton", "cpu"
    attention_backend: str = "auto"
    # How a step's forward pass runs: "eager" (the PyTorch model in transformer.py, attention
    # through attention_backend), "cpu" (the whole step in one C call, model/cpu_forward.py),
    # "auto" (cpu where the "cpu" attention backend runs and no custom attention is given, except
    # for steps with long prefill chunks, which torch attends faster: runner.EAGER_PREFILL_WORK)
    forward: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0  # for unseeded sampled requests
    record_page_owners: bool = False  # keep a page->request map per step (for the page-pool plot)

    def __post_init__(self):
        checks = [
            (self.page_size >= 1, f"page_size must be >= 1, got {self.page_size}"),
            (self.num_pages is None or self.num_pages >= 1, f"num_pages must be >= 1, got {self.num_pages}"),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (self.max_num_batched_tokens >= 1,
             f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"),
            (self.scheduler in ("continuous", "static"),
             f"scheduler must be 'continuous' or 'static', got {self.scheduler!r}"),
            (self.kv_layout in ("paged", "contiguous"),
             f"kv_layout must be 'paged' or 'contiguous', got {self.kv_layout!r}"),
            (self.admission in ("none", "reserve", "watermark"),
             f"admission must be 'none', 'reserve' or 'watermark', got {self.admission!r}"),
            (self.preemption in ("recompute", "fail"),
             f"preemption must be 'recompute' or 'fail', got {self.preemption!r}"),
            (self.attention_backend in ("auto", "torch", "reference", "triton", "cpu"),
             f"attention_backend must be auto, torch, reference, triton or cpu, got {self.attention_backend!r}"),
            (self.forward in ("auto", "eager", "cpu"),
             f"forward must be auto, eager or cpu, got {self.forward!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
