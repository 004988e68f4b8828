"""Notebook 05 (a hundred users): latency percentiles, and a closed-loop load generator."""
import random

import numpy as np

_FAILED = ("error", "aborted")


def _completed(r):
    return r.finish_time is not None and r.finish_reason not in _FAILED


def _percentiles(values):
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])  # linear interpolation
    return {"p50": float(p50), "p99": float(p99)}


def latency_summary(records):
    """p50 / p99 of TTFT, TPOT and end-to-end latency over the requests that completed normally
    (not failed, not aborted), and output-token throughput over the whole run.

    TTFT = first_token_time - arrival_time; TPOT = (finish_time - first_token_time) /
    (number of output tokens - 1), for requests with at least 2 output tokens; latency =
    finish_time - arrival_time. Throughput = output tokens of completed requests / (last
    finish_time - first arrival_time) over all requests (0.0 if that span is 0)."""
    done = [r for r in records if _completed(r)]
    ttft = [r.first_token_time - r.arrival_time for r in done if r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.token_ids) - 1)
            for r in done if r.first_token_time is not None and len(r.token_ids) >= 2]
    latency = [r.finish_time - r.arrival_time for r in done]
    arrivals = [r.arrival_time for r in records if r.arrival_time is not None]
    finishes = [r.finish_time for r in records if r.finish_time is not None]
    span = max(finishes) - min(arrivals) if arrivals and finishes else 0.0
    tokens = sum(len(r.token_ids) for r in done)
    return {
        "ttft": _percentiles(ttft),
        "tpot": _percentiles(tpot),
        "latency": _percentiles(latency),
        "throughput_tok_s": tokens / span if span > 0 else 0.0,
    }


def run_closed_loop(make_engine, num_users, num_requests, make_prompt, seed):
    """`num_users` users each send a request, wait for its answer, and send their next one at once,
    until `num_requests` requests have been sent. `make_engine()` builds the engine (call it once);
    `make_prompt(rng)` returns (prompt_token_ids, SamplingParams) for the next request, where
    rng = random.Random(seed) is created once and shared by all calls. Returns the finished
    RequestOutputs in the order the requests were sent."""
    engine = make_engine()
    rng = random.Random(seed)
    sent, done = [], {}

    def send():
        prompt, params = make_prompt(rng)
        sent.append(engine.add_request(prompt, params))

    for _ in range(min(num_users, num_requests)):
        send()
    while len(done) < num_requests:
        if not engine.has_unfinished_requests:
            raise RuntimeError(f"engine is idle but only {len(done)} of {num_requests} requests finished")
        for out in engine.step():
            if out.finished and out.request_id not in done:
                done[out.request_id] = out
                if len(sent) < num_requests:
                    send()  # this user's next request
    return [done[rid] for rid in sent]
