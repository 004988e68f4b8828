"""Notebook 07 (admission control): a watermark policy, and counting what preemption cost."""


class StudentWatermark:
    """Admit a waiting request only if, after its first chunk is placed, at least `watermark`
    (a fraction) of the pool is still free: room for the running requests to keep growing."""

    def __init__(self, watermark):
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.watermark = watermark

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        need = kv.num_pages_needed(request, num_new_tokens, cached_pages)
        return kv.num_free_pages - need >= self.watermark * kv.num_pages


def preemption_report(engine):
    """How much preemption happened in `engine`'s run, from its requests' own counters."""
    counts = [r.num_preemptions for r in engine.requests.values()]
    return {
        "preemptions": sum(counts),
        "preempted_requests": sum(1 for c in counts if c > 0),
        "max_preemptions_one_request": max(counts, default=0),
    }
