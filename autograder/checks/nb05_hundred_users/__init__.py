"""Checks for notebook 05 (a hundred users): latency percentiles, and the closed-loop driver.

`latency_summary` is compared with the definitions of course_lib.sim.metrics (completed requests
only, TPOT over n - 1 gaps, numpy's linear-interpolation percentiles, throughput over the
makespan) on hand-built RequestOutputs: failed and aborted requests that finish last, one-token
answers, an idle gap with nothing in flight (it counts in the makespan), zero-length steps (a
TTFT of 0 at time 0, several tokens in one instant: a TPOT of 0), a run that takes no time at all
(throughput 0.0), and one where nothing has finished yet; the counters `completed` and `output_tokens` must be exact. `run_closed_loop` drives a scripted engine whose clock
advances by one per step, so "the next request is sent the moment the previous one finishes"
is an exact equation: after every step, sent = min(num_requests, num_users + finished). One case
serves fewer seats than users (`max_num_seqs < num_users`): requests queue on the server, in the
order they were sent (first come, first served), and the loop must still send each request the
moment its user is free, not when the server has room (that would hide the queueing from TTFT).
"""
from __future__ import annotations

from .latency_summary import check_latency_summary
from .run_closed_loop import check_run_closed_loop
