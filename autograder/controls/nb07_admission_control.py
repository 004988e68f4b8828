"""Correct answers for notebook 07 written differently from the reference: each must pass every graded
seed (a check that fails them is a false alarm). Self-contained: no autograder imports."""
import math


class WatermarkInWholePages:
    """Rounds the headroom up to whole pages first (the free count is an int, so >= ceil(x) is >= x)."""

    def __init__(self, watermark):
        if not (watermark >= 0.0 and watermark < 1.0):  # also refuses NaN
            raise ValueError(f"watermark {watermark!r} is not a fraction of the pool in [0, 1)")
        self.keep = watermark

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        left = kv.num_free_pages - kv.num_pages_needed(request, num_new_tokens, cached_pages)
        return left >= math.ceil(self.keep * kv.num_pages - 1e-9)


class WatermarkAsPagesKept:
    """Computes how many pages may still be handed out above the watermark, then compares the need."""

    def __init__(self, watermark):
        if watermark != watermark or watermark < 0 or watermark >= 1:
            raise ValueError("watermark must be in [0, 1)")
        self.watermark = float(watermark)

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        spendable = kv.num_free_pages - self.watermark * kv.num_pages
        return kv.num_pages_needed(request, num_new_tokens, cached_pages) <= spendable


def report_one_pass(engine):
    """One loop over the requests, three running totals."""
    total = victims = worst = 0
    for request in engine.requests.values():
        n = request.num_preemptions
        total += n
        if n:
            victims += 1
        worst = n if n > worst else worst
    return {"preemptions": total, "preempted_requests": victims, "max_preemptions_one_request": worst}


def report_with_counter(engine):
    """A Counter of preemption counts per request."""
    from collections import Counter

    hist = Counter(r.num_preemptions for r in engine.requests.values())
    return {"preemptions": int(sum(k * v for k, v in hist.items())),
            "preempted_requests": int(sum(v for k, v in hist.items() if k > 0)),
            "max_preemptions_one_request": int(max(hist, default=0))}


def break_it_many_users():
    """A hundred users on 8,192 tokens, answers up to 512."""
    return {"users": 100, "kv_tokens": 8192, "max_tokens": 512, "watermark": 0.05}


def break_it_small_pool():
    """Sixteen users on 2,048 tokens (a 1,024-token prompt + 256 still fits), a 20% watermark."""
    return {"users": 16, "kv_tokens": 2048, "max_tokens": 256, "watermark": 0.2}



# --- preemption by recompute, written two other ways
from course_lib.scheduler.continuous import ContinuousScheduler  # noqa: E402
from course_lib.scheduler.request import RequestStatus  # noqa: E402


class RecomputeByAdmitSeq(ContinuousScheduler):
    """Finds the youngest by its admission number; rebuilds both lists (in place) to requeue."""

    def choose_victim(self):
        return max((r for r in self.running if r.finish_reason is None), key=lambda r: r.admit_seq)

    def preempt(self, request):
        self.running[:] = [r for r in self.running if r is not request]  # in place: the scheduler walks it
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        queue = list(self.waiting)
        self.waiting.clear()
        self.waiting.extend([request] + queue)


class RecomputeWalkingBack(ContinuousScheduler):
    """Walks the running list from its end; deque.insert(0, ...) to requeue."""

    def choose_victim(self):
        for request in reversed(self.running):
            if request.finish_reason is None:
                return request
        raise RuntimeError("nothing to preempt")

    def preempt(self, request):
        del self.running[self.running.index(request)]
        request.num_computed_tokens = 0
        self.kv.free(request)
        self.waiting.insert(0, request)
        request.status = RequestStatus.PREEMPTED


from course_lib.scheduler.victims import PreemptionScheduler  # noqa: E402


class RecomputeAskerYields(PreemptionScheduler):
    """Another victim policy: the oldest request that may still go in this step (the one asking for room)."""

    def choose_victim(self):
        return self.preemptible[0]

    def preempt(self, request):
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class RecomputeLeastWork(PreemptionScheduler):
    """Another victim policy: of the requests that may go, the one with the fewest computed tokens (ties: the
    youngest), so the least work is thrown away."""

    def choose_victim(self):
        return min(reversed(self.preemptible), key=lambda r: r.num_computed_tokens)

    def preempt(self, request):
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


CONTROLS = {
    "StudentWatermark": [WatermarkInWholePages, WatermarkAsPagesKept],
    "preemption_report": [report_one_pass, report_with_counter],
    "break_it_config": [break_it_many_users, break_it_small_pool],
    "StudentRecompute": [RecomputeByAdmitSeq, RecomputeWalkingBack, RecomputeAskerYields, RecomputeLeastWork],
}
