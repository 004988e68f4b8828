"""Notebook 05 hundred_users: reference solutions. GENERATED from solutions/05_hundred_users/05_hundred_users.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


import random
import numpy as np


def latency_summary(records) -> dict:
    """p50/p99 of TTFT, TPOT and latency over completed requests, and output-token throughput."""
    done = [r for r in records if r.finish_time is not None and r.finish_reason not in ("error", "aborted")]

    def pcts(values):
        if not values:
            return {"p50": None, "p99": None}
        p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])
        return {"p50": float(p50), "p99": float(p99)}

    ttft = [r.first_token_time - r.arrival_time for r in done if r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.token_ids) - 1)
            for r in done if r.first_token_time is not None and len(r.token_ids) >= 2]
    latency = [r.finish_time - r.arrival_time for r in done]
    arrivals = [r.arrival_time for r in records if r.arrival_time is not None]
    finishes = [r.finish_time for r in records if r.finish_time is not None]
    span = (max(finishes) - min(arrivals)) if arrivals and finishes else 0.0
    tokens = sum(len(r.token_ids) for r in done)
    return {"ttft": pcts(ttft), "tpot": pcts(tpot), "latency": pcts(latency),
            "throughput_tok_s": tokens / span if span > 0 else 0.0, "completed": len(done), "output_tokens": tokens}


def run_closed_loop(make_engine, num_users: int, num_requests: int, make_prompt, seed: int) -> list:
    """num_users users, each sending its next request as soon as its last one is answered."""
    engine = make_engine()
    rng = random.Random(seed)
    order, finished = [], {}

    def send():
        prompt_ids, params = make_prompt(rng)
        order.append(engine.add_request(prompt_ids, params))

    for _ in range(min(num_users, num_requests)):
        send()
    while len(finished) < num_requests:
        for out in engine.step():
            if out.finished and out.request_id not in finished:
                finished[out.request_id] = out
                if len(order) < num_requests:
                    send()  # the same user asks again
    return [finished[rid] for rid in order]
