"""Notebook 07 admission_control: reference solutions. GENERATED from solutions/07_admission_control/07_admission_control.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


from course_lib.scheduler.request import RequestStatus
from course_lib.scheduler.victims import PreemptionScheduler


class StudentRecompute(PreemptionScheduler):
    """course_lib's continuous scheduler, with your preemption by recompute."""

    def choose_victim(self):
        """The running request that gives its pages back when the pool is full."""
        return self.preemptible[-1]  # youngest first: it has done the least work, the older ones keep their places

    def preempt(self, request) -> None:
        """Give back every page of `request` and requeue it, to be recomputed from its prompt and output."""
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class StudentWatermark:
    """Admit only if a `watermark` fraction of the pool stays free after the request's first chunk."""

    def __init__(self, watermark: float):
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction of the pool in [0, 1), got {watermark}")
        self.watermark = watermark

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        need = kv.num_pages_needed(request, num_new_tokens, cached_pages)
        return kv.num_free_pages - need >= self.watermark * kv.num_pages


def preemption_report(engine) -> dict:
    """Preemption events, preempted requests, and the worst case for one request."""
    counts = [request.num_preemptions for request in engine.requests.values()]
    return {
        "preemptions": sum(counts),
        "preempted_requests": sum(1 for c in counts if c > 0),
        "max_preemptions_one_request": max(counts, default=0),
    }


def break_it_config() -> dict:
    """A load, a pool and an answer cap under which no admission control fails requests mid-answer."""
    # The largest request: a 1,024-token prompt + 512 answer tokens = 1,535 slots, so 4,096 tokens hold any
    # one of them (twice over); 32 users whose answers grow together outgrow it within a few hundred steps.
    return {"users": 32, "kv_tokens": 4096, "max_tokens": 512, "watermark": 0.1}


class MyAdmission:
    """Your admission policy (edit me). It starts as your watermark: change can_admit and rerun the ranking."""

    def __init__(self):
        self.inner = watermark_cls(config["watermark"])

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        return self.inner.can_admit(request, num_new_tokens, cached_pages, kv, running)
