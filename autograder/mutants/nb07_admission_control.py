"""Realistic wrong answers for notebook 07 (admission control). Self-contained: no autograder imports."""


class _Watermark:
    def __init__(self, watermark):
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.watermark = watermark

    def _need(self, request, num_new_tokens, cached_pages, kv):
        return kv.num_pages_needed(request, num_new_tokens, cached_pages)

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        return kv.num_free_pages - self._need(request, num_new_tokens, cached_pages, kv) >= self.watermark * kv.num_pages


class AdmitsEverything(_Watermark):
    """Ignores the pages: always admits."""

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        return True


class IgnoresOwnNeed(_Watermark):
    """Checks the free pages now, forgetting the pages this request is about to take."""

    def _need(self, request, num_new_tokens, cached_pages, kv):
        return 0


class StrictlyAbove(_Watermark):
    """Uses > where >= belongs: refuses a request that leaves exactly the watermark free."""

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        return kv.num_free_pages - self._need(request, num_new_tokens, cached_pages, kv) > self.watermark * kv.num_pages


class FloorPages(_Watermark):
    """Counts num_new_tokens // page_size pages: a partly filled page is forgotten."""

    def _need(self, request, num_new_tokens, cached_pages, kv):
        return num_new_tokens // kv.page_size


class IgnoresCachedPages(_Watermark):
    """Counts only fresh pages: cached pages that must be revived from the free list are forgotten."""

    def _need(self, request, num_new_tokens, cached_pages, kv):
        return -(-num_new_tokens // kv.page_size)


class NoValidation(_Watermark):
    """Accepts any watermark, even 1.5 or -0.1."""

    def __init__(self, watermark):
        self.watermark = watermark


class WatermarkInPages(_Watermark):
    """Treats the watermark fraction as a number of pages."""

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        return kv.num_free_pages - self._need(request, num_new_tokens, cached_pages, kv) >= self.watermark


def report_running_only(engine):
    """Looks at the scheduler's queues, which are empty once every request has finished."""
    live = list(engine.scheduler.running) + list(engine.scheduler.waiting)
    counts = [r.num_preemptions for r in live]
    return {"preemptions": sum(counts), "preempted_requests": sum(1 for c in counts if c > 0),
            "max_preemptions_one_request": max(counts, default=0)}


def report_events_as_requests(engine):
    """Counts preemption events as preempted requests."""
    total = sum(r.num_preemptions for r in engine.requests.values())
    return {"preemptions": total, "preempted_requests": total,
            "max_preemptions_one_request": max((r.num_preemptions for r in engine.requests.values()), default=0)}


def report_max_from_steps(engine):
    """Takes the largest number of preemptions in one step as the most for one request."""
    counts = [r.num_preemptions for r in engine.requests.values()]
    return {"preemptions": sum(counts), "preempted_requests": sum(1 for c in counts if c > 0),
            "max_preemptions_one_request": max((s.num_preemptions for s in engine.step_stats), default=0)}


def report_counts_steps(engine):
    """Counts the steps that preempted, not the preemptions."""
    counts = [r.num_preemptions for r in engine.requests.values()]
    return {"preemptions": sum(1 for s in engine.step_stats if s.num_preemptions),
            "preempted_requests": sum(1 for c in counts if c > 0), "max_preemptions_one_request": max(counts, default=0)}


MUTANTS = {
    "StudentWatermark": [AdmitsEverything, IgnoresOwnNeed, StrictlyAbove, FloorPages, IgnoresCachedPages, NoValidation,
                         WatermarkInPages],
    "preemption_report": [report_running_only, report_events_as_requests, report_max_from_steps, report_counts_steps],
}
