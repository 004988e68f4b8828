"""Every knob of the engine, each with a default that serves the tiny model well.

`OPTIONS` is the one list of the names each string-valued knob takes. `EngineConfig` validates
against it (and its error messages list it), and the command lines take their `choices` from it
(`simulate`, `bench engine`). Where a name stands for a class (a scheduler, an admission policy)
it is the class's own `name`, and `SCHEDULERS` / `ADMISSION_POLICIES` map it back: the engine
builds its scheduler from `SCHEDULERS`, and `scheduler.admission.make_admission` builds each
policy listed here (tests/test_engine_options.py holds it, `serve`'s flags and
`course_lib.attention.BACKENDS` to this list).

(Imports stay torch-free: `simulate --help` reads these lists without loading torch.)
"""
from __future__ import annotations

from dataclasses import dataclass

from .scheduler.admission import NoAdmissionControl, ReserveAdmission, WatermarkAdmission
from .scheduler.base import PREEMPTION_MODES
from .scheduler.continuous import ContinuousScheduler
from .scheduler.static import StaticScheduler
from .spec import DRAFTERS

SCHEDULERS = {cls.name: cls for cls in (ContinuousScheduler, StaticScheduler)}
ADMISSION_POLICIES = {cls.name: cls for cls in (NoAdmissionControl, ReserveAdmission, WatermarkAdmission)}
OPTIONS: dict[str, tuple[str, ...]] = {
    "scheduler": tuple(SCHEDULERS),
    "kv_layout": ("paged", "contiguous"),  # contiguous: one max_model_len page per request
    "admission": tuple(ADMISSION_POLICIES),
    "preemption": PREEMPTION_MODES,
    # "auto" and course_lib.attention.BACKENDS (that package loads torch, so it is not imported here;
    # tests/test_engine_options.py holds the two to each other)
    "attention_backend": ("auto", "torch", "reference", "triton", "cpu"),
    "forward": ("auto", "eager", "cpu"),  # runner.resolve_forward says what "auto" takes
    "speculative": DRAFTERS,  # course_lib/spec: "none", or who drafts
}
# Knobs whose error message quotes its choices ("'paged' or 'contiguous'"); the others read
# "auto, eager or cpu". Both as the messages always read (tests and users match them).
_QUOTED = {"scheduler", "kv_layout", "admission", "preemption", "speculative"}


def one_of(names, quote: bool = True) -> str:
    """("a", "b", "c") -> "'a', 'b' or 'c'" (or "a, b or c"): the choices as an error message says them."""
    names = [repr(n) if quote else n for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass
class EngineConfig:
    page_size: int = 16
    num_pages: int | None = None  # None: room for max_num_seqs requests at half of max_model_len
    max_num_seqs: int = 64  # seats in the batch
    max_num_batched_tokens: int = 512  # tokens one forward pass may compute (the chunked-prefill budget)
    # The string knobs take the names in OPTIONS.
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
    # Speculative decoding (course_lib/spec): "none", "ngram" (prompt lookup) or "draft" (the model's
    # first `draft_layers` layers draft); up to num_speculative_tokens drafts per decode step. Without a
    # model (the scripted runner) the target keeps each draft with probability spec_acceptance_rate.
    speculative: str = "none"
    num_speculative_tokens: int = 3
    draft_layers: int = 1
    spec_acceptance_rate: float = 0.7

    def __post_init__(self):
        checks = [
            (self.page_size >= 1, f"page_size must be >= 1, got {self.page_size}"),
            (self.num_pages is None or self.num_pages >= 1, f"num_pages must be >= 1, got {self.num_pages}"),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (self.max_num_batched_tokens >= 1,
             f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"),
            (self.num_speculative_tokens >= 1,
             f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"),
            (0.0 <= self.spec_acceptance_rate <= 1.0,
             f"spec_acceptance_rate must be within [0, 1], got {self.spec_acceptance_rate}"),
        ] + [
            (getattr(self, knob) in names,
             f"{knob} must be {one_of(names, knob in _QUOTED)}, got {getattr(self, knob)!r}")
            for knob, names in OPTIONS.items()
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
