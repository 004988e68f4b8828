"""N users who each wait for their answer before asking again, over any engine; and the latency
summary of what they saw. The shapes notebook 5 asks students to write (`run_closed_loop`,
`latency_summary`), so that its later cells can fall back to course_lib's.

`simulate` (sim/simulate.py) is the full driver (workloads, open loops, clocks); this is the
plain closed loop over an engine someone else built, with prompts from a caller's function.
"""
from __future__ import annotations

import random

from .metrics import summarize


def run_closed_loop(make_engine, num_users: int, num_requests: int, make_prompt, seed: int) -> list:
    """Serve `num_requests` requests from `num_users` closed-loop users on `make_engine()`.

    Each user has at most one request in flight; when it finishes, that user sends the next one at
    once (before the engine's next step), whether or not the engine has a free seat: the engine
    queues it, first come first served, and the wait is part of its TTFT. Prompts come from
    `make_prompt(rng)` -> (prompt_ids, SamplingParams), with one `random.Random(seed)` for the run.
    Returns the finished RequestOutputs in the order the requests were sent.
    """
    if num_users < 1 or num_requests < 0:
        raise ValueError(f"need num_users >= 1 and num_requests >= 0, got {num_users} and {num_requests}")
    engine = make_engine()
    rng = random.Random(seed)
    sent: list[str] = []
    finished: dict[str, object] = {}

    def send() -> None:
        prompt_ids, params = make_prompt(rng)
        sent.append(engine.add_request(prompt_ids, params))

    while len(sent) < min(num_users, num_requests):
        send()
    while len(finished) < num_requests:
        if not engine.has_unfinished_requests:
            raise RuntimeError(f"the engine stopped with {len(finished)} of {num_requests} requests finished")
        for out in engine.step():
            if out.finished and out.request_id not in finished:
                finished[out.request_id] = out
                if len(sent) < num_requests:
                    send()  # this user's next request
    return [finished[request_id] for request_id in sent]


def latency_summary(records) -> dict:
    """p50 / p99 of TTFT, TPOT and end-to-end latency over the completed requests, output-token
    throughput over the makespan, and the counts behind it (course_lib.sim.metrics' definitions)."""
    full = summarize(list(records), [])

    def p50_p99(key):
        return {"p50": full[key]["p50"], "p99": full[key]["p99"]}

    return {"ttft": p50_p99("ttft_s"), "tpot": p50_p99("tpot_s"), "latency": p50_p99("latency_s"),
            "throughput_tok_s": full["throughput_tok_s"], "completed": full["requests_completed"],
            "output_tokens": full["output_tokens"]}
