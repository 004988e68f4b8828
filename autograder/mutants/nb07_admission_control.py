"""Realistic wrong answers for notebook 07 (admission control). Self-contained: no autograder imports."""
from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.scheduler.request import RequestStatus


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


class ReservesPages(_Watermark):
    """Allocates the pages of a request it admits ("reserving" them): the scheduler then allocates them again."""

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        admit = super().can_admit(request, num_new_tokens, cached_pages, kv, running)
        if admit:
            kv.allocate(request, num_new_tokens, cached_pages)
        return admit


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




def report_finished_only(engine):
    """Counts only the requests that have finished: mid-run, a preempted request still waiting is missed."""
    counts = [r.num_preemptions for r in engine.requests.values() if r.is_finished]
    return {"preemptions": sum(counts), "preempted_requests": sum(1 for c in counts if c > 0),
            "max_preemptions_one_request": max(counts, default=0)}


def report_numpy_counts(engine):
    """Counts with numpy: right numbers, but numpy integers, not plain ints."""
    import numpy as np

    counts = np.array([r.num_preemptions for r in engine.requests.values()], dtype=np.int64)
    return {"preemptions": counts.sum(), "preempted_requests": (counts > 0).sum(),
            "max_preemptions_one_request": counts.max(initial=0)}


def report_skips_failed(engine):
    """Leaves out failed requests (finish_reason 'error'), whose preemption was their failure."""
    counts = [r.num_preemptions for r in engine.requests.values()
              if r.finish_reason is None or r.finish_reason.value != "error"]
    return {"preemptions": sum(counts), "preempted_requests": sum(1 for c in counts if c > 0),
            "max_preemptions_one_request": max(counts, default=0)}


def break_it_pool_below_one_request():
    """A tiny pool: requests are refused at the door (larger than the pool), which no recompute can fix."""
    return {"users": 64, "kv_tokens": 512, "max_tokens": 512, "watermark": 0.05}


def break_it_too_light():
    """One user in a huge pool: nothing ever runs out, so nothing breaks without admission control."""
    return {"users": 1, "kv_tokens": 65536, "max_tokens": 1024, "watermark": 0.05}


def break_it_pool_in_pages():
    """Gives the pool in pages (256) where tokens are asked: 256 tokens hold no long prompt."""
    return {"users": 32, "kv_tokens": 256, "max_tokens": 256, "watermark": 0.05}


def break_it_watermark_in_percent():
    """Writes the watermark as a percentage (5) instead of a fraction of the pool."""
    return {"users": 32, "kv_tokens": 4096, "max_tokens": 512, "watermark": 5}


def break_it_pool_fits_typical_request():
    """Sizes the pool for a typical request (1,024 tokens) but not the largest one the workload sends: with
    preemption on, a long prompt + max_tokens still never fits, and fails."""
    return {"users": 64, "kv_tokens": 1024, "max_tokens": 768, "watermark": 0.05}


def break_it_pool_below_largest_request():
    """A pool of 1,536 tokens with answers up to 600: the largest request needs 1,024 + 600 - 1 = 1,623 slots.
    It passes seeds 0, 1 and 2 by luck (none of them draws a prompt long enough to be refused), but another
    seed refuses that request at the door."""
    return {"users": 32, "kv_tokens": 1536, "max_tokens": 600, "watermark": 0.1}


def break_it_as_a_tuple():
    """Values that work, returned as a tuple in the order the statement lists the keys, not as a dict."""
    return 32, 4096, 512, 0.1


def break_it_max_tokens_beyond_cap():
    """Asks for answers longer than the workload's cap (2,048 > 1,024)."""
    return {"users": 32, "kv_tokens": 8192, "max_tokens": 2048, "watermark": 0.05}


# --- preemption by recompute (StudentRecompute): each breaks one rule of the give-back or the victim choice


class _Recompute(ContinuousScheduler):
    def choose_victim(self):
        return self.running[-1]

    def preempt(self, request):
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class VictimOldest(_Recompute):
    """Preempts the oldest of ALL running requests: in a step, that one is usually scheduled already, which the
    engine refuses (the oldest that may still go is in PreemptionScheduler's self.preemptible)."""

    def choose_victim(self):
        return self.running[0]


class VictimLeastWork(_Recompute):
    """Preempts the request with the fewest computed tokens ("it loses the least"): not the youngest, and in a
    step possibly one the scheduler has already scheduled, which the engine refuses."""

    def choose_victim(self):
        return min(self.running, key=lambda r: r.num_computed_tokens)


class VictimLargest(_Recompute):
    """Preempts the request holding the most pages among ALL running ones, scheduled in this step or not."""

    def choose_victim(self):
        return max(self.running, key=lambda r: len(self.kv.tables[r.request_id].pages))


class RequeueAtBack(_Recompute):
    """Puts the victim at the back of the queue: requests that came later overtake it."""

    def preempt(self, request):
        super().preempt(request)
        self.waiting.remove(request)
        self.waiting.append(request)


class KeepsProgress(_Recompute):
    """Does not reset the progress counter: the victim 'continues' from K/V it no longer has."""

    def preempt(self, request):
        computed = request.num_computed_tokens
        super().preempt(request)
        request.num_computed_tokens = computed


class LeavesVictimRunning(_Recompute):
    """Frees and requeues the victim but forgets to take it out of the running list: it runs and waits at once."""

    def preempt(self, request):
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class NeverFreesPages(_Recompute):
    """Forgets to give the pages back: the pool never gets the room the preemption was for."""

    def preempt(self, request):
        self.running.remove(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class FreesPoolNotManager(_Recompute):
    """Frees the pages in the pool directly, behind the KV manager's back (its page table stays)."""

    def preempt(self, request):
        self.running.remove(request)
        self.kv.pool.free(list(self.kv.tables[request.request_id].pages))
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class RestartsAnswer(_Recompute):
    """Throws the victim's answer away too: it generates from the prompt again (more work, later tokens)."""

    def preempt(self, request):
        super().preempt(request)
        del request.output_token_ids[:]


class CountsItself(_Recompute):
    """Counts the preemption in preempt as well: the scheduler already does, so every report doubles."""

    def preempt(self, request):
        super().preempt(request)
        request.num_preemptions += 1


class RebindsQueues(_Recompute):
    """Builds new lists for running and waiting: the scheduler's loop still walks the old running list."""

    def preempt(self, request):
        self.running = [r for r in self.running if r is not request]
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting = type(self.waiting)([request, *self.waiting])


class ChoosingTakesOut(_Recompute):
    """Takes the victim out of the running list as it names it (self.running.pop()): the engine always preempts
    whom it names, but a scheduler that only asks loses a running request."""

    def choose_victim(self):
        return self.running.pop()

    def preempt(self, request):
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)


class AnswerIntoPrompt(_Recompute):
    """Appends the victim's answer to its prompt "so the recompute sees it": the answer is kept, but the
    context now holds it twice, and every later token is predicted from that context."""

    def preempt(self, request):
        super().preempt(request)
        request.prompt_token_ids.extend(request.output_token_ids)


class StatusStillRunning(_Recompute):
    """Leaves the victim's status at RUNNING although it waits in the queue."""

    def preempt(self, request):
        super().preempt(request)
        request.status = RequestStatus.RUNNING


MUTANTS = {
    "StudentWatermark": [AdmitsEverything, IgnoresOwnNeed, StrictlyAbove, FloorPages, IgnoresCachedPages, NoValidation,
                         WatermarkInPages, ReservesPages],
    "preemption_report": [report_running_only, report_events_as_requests, report_max_from_steps, report_counts_steps,
                          report_finished_only, report_skips_failed, report_numpy_counts],
    "break_it_config": [break_it_pool_below_largest_request,
                        break_it_pool_below_one_request, break_it_too_light, break_it_pool_in_pages,
                        break_it_watermark_in_percent, break_it_max_tokens_beyond_cap, break_it_pool_fits_typical_request,
                        break_it_as_a_tuple],
    "StudentRecompute": [VictimOldest, VictimLargest, VictimLeastWork, RequeueAtBack, KeepsProgress,
                         LeavesVictimRunning, NeverFreesPages, FreesPoolNotManager, RestartsAnswer, CountsItself,
                         RebindsQueues, StatusStillRunning, ChoosingTakesOut, AnswerIntoPrompt],
}
