"""What preemption cost a run, counted from the requests themselves (each keeps `num_preemptions`,
whether it then finished, is still waiting, or failed because preemption was off)."""
from __future__ import annotations


def preemption_report(engine) -> dict:
    """{"preemptions": events, "preempted_requests": distinct victims, "max_preemptions_one_request"}."""
    counts = [request.num_preemptions for request in engine.requests.values()]
    return {
        "preemptions": sum(counts),
        "preempted_requests": sum(1 for c in counts if c > 0),
        "max_preemptions_one_request": max(counts, default=0),
    }
