"""Correct answers for notebook 05 written differently from the reference: each must pass every graded
seed (a check that fails them is a false alarm). Self-contained: no autograder imports."""
import math
import random


def _percentile(sorted_values, p):
    """Linear interpolation between the order statistics around rank (n - 1) * p / 100, by hand."""
    position = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(position), math.ceil(position)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (position - lo)


def summary_by_hand(records):
    """No numpy: one pass sorting records into lists, percentiles interpolated by hand."""
    ttft, tpot, latency = [], [], []
    tokens = completed = 0
    first_arrival, last_finish = math.inf, -math.inf
    for r in records:
        first_arrival = min(first_arrival, r.arrival_time)
        if r.finish_time is None:
            continue
        last_finish = max(last_finish, r.finish_time)
        if r.finish_reason in ("error", "aborted"):
            continue
        completed += 1
        tokens += len(r.token_ids)
        latency.append(r.finish_time - r.arrival_time)
        if r.first_token_time is not None:
            ttft.append(r.first_token_time - r.arrival_time)
            if len(r.token_ids) > 1:
                tpot.append((r.finish_time - r.first_token_time) / (len(r.token_ids) - 1))

    def pcts(values):
        values = sorted(values)
        if not values:
            return {"p50": None, "p99": None}
        return {"p50": float(_percentile(values, 50)), "p99": float(_percentile(values, 99))}

    span = last_finish - first_arrival if last_finish > -math.inf else 0.0
    return {"ttft": pcts(ttft), "tpot": pcts(tpot), "latency": pcts(latency),
            "throughput_tok_s": tokens / span if span > 0 else 0.0, "completed": completed, "output_tokens": tokens}


def closed_loop_per_user(make_engine, num_users, num_requests, make_prompt, seed):
    """Keeps each user's outstanding request id; a finished request frees exactly its user, who sends
    the next one. Results collected by send index."""
    engine = make_engine()
    rng = random.Random(seed)
    user_of, index_of, results = {}, {}, {}
    next_index = 0

    def send(user):
        nonlocal next_index
        prompt_ids, params = make_prompt(rng)
        request_id = engine.add_request(prompt_ids, params)
        user_of[request_id], index_of[request_id] = user, next_index
        next_index += 1

    for user in range(num_users):
        if next_index < num_requests:
            send(user)
    while len(results) < num_requests:
        for out in engine.step():
            if out.finished and index_of[out.request_id] not in results:
                results[index_of[out.request_id]] = out
                if next_index < num_requests:
                    send(user_of.pop(out.request_id))
    return [results[i] for i in range(num_requests)]


CONTROLS = {
    "latency_summary": [summary_by_hand],
    "run_closed_loop": [closed_loop_per_user],
}
