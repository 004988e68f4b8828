"""Realistic wrong answers for notebook 05 (a hundred users). Self-contained: no autograder imports."""
import random

import numpy as np


def _pct(values, how):
    if not values:
        return {"p50": None, "p99": None}
    if how == "nearest_rank":
        s = sorted(values)
        pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
        return {"p50": float(pick(0.50)), "p99": float(pick(0.99))}
    if how == "unsorted":
        pick = lambda q: values[min(len(values) - 1, int(round(q * (len(values) - 1))))]  # noqa: E731
        return {"p50": float(pick(0.50)), "p99": float(pick(0.99))}
    p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])
    return {"p50": float(p50), "p99": float(p99)}


def _summary(records, how="linear", include_failed=False, tpot_div=lambda n: n - 1, ttft_start="arrival_time",
             truthy=False, busy=False, count_all=False, drop_empty=False):
    done = [r for r in records if r.finish_time is not None and (include_failed or r.finish_reason not in ("error", "aborted"))]
    if drop_empty:
        done = [r for r in done if r.first_token_time is not None]
    if truthy:
        done = [r for r in done if r.first_token_time and r.finish_time]
    ttft = [r.first_token_time - getattr(r, ttft_start) for r in done if r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / tpot_div(len(r.token_ids)) for r in done
            if r.first_token_time is not None and len(r.token_ids) >= 2]
    latency = [r.finish_time - r.arrival_time for r in done]
    finishes = [r.finish_time for r in records if r.finish_time is not None]
    span = max(finishes) - min(r.arrival_time for r in records) if finishes else 0.0
    if busy:  # only the time some request was in flight
        span, end = 0.0, -float("inf")
        for a, b in sorted((r.arrival_time, r.finish_time) for r in records if r.finish_time is not None):
            if b > end:
                span += b - max(a, end)
                end = b
    tokens = sum(len(r.token_ids) for r in done)
    completed = sum(r.finish_time is not None for r in records) if count_all else len(done)
    return {"ttft": _pct(ttft, how), "tpot": _pct(tpot, how), "latency": _pct(latency, how),
            "throughput_tok_s": tokens / span if span > 0 else 0.0, "completed": completed, "output_tokens": tokens}


def summary_drops_empty_answers(records):
    """Counts a request as completed only if it produced a token (filters on first_token_time): a
    zero-length answer vanishes from `completed` and from the latencies."""
    return _summary(records, drop_empty=True)


def summary_nearest_rank(records):
    """Percentiles by nearest rank, without interpolation."""
    return _summary(records, how="nearest_rank")


def summary_unsorted(records):
    """Takes the percentile's index in the unsorted list."""
    return _summary(records, how="unsorted")


def summary_tpot_over_n(records):
    """TPOT divided by all output tokens instead of the n - 1 gaps."""
    return _summary(records, tpot_div=lambda n: n)


def summary_includes_failed(records):
    """Failed and aborted requests count in the latency statistics."""
    return _summary(records, include_failed=True)


def summary_ttft_from_scheduling(records):
    """TTFT measured from first_scheduled_time: queueing time is forgotten."""
    return _summary(records, ttft_start="first_scheduled_time")


def summary_truthy_times(records):
    """Skips requests whose first_token_time or finish_time is falsy: a time of 0.0 read as missing."""
    return _summary(records, truthy=True)


def summary_busy_time(records):
    """Throughput over the time something was in flight, not the makespan (idle gaps left out)."""
    return _summary(records, busy=True)


def summary_counts_failed_as_completed(records):
    """Right latencies, but `completed` counts every finished request, failed and aborted ones too."""
    return _summary(records, count_all=True)


def summary_percentiles_as_arrays(records):
    """Keeps what `numpy.percentile(values, [50, 99])` returns, an array of the two, where the interface asks
    for a dict `{"p50": .., "p99": ..}`."""
    right = _summary(records)
    for key in ("ttft", "tpot", "latency"):
        part = right[key]
        if part["p50"] is not None:  # (no values: the guard's dict of Nones, as written for that case)
            right[key] = np.array([part["p50"], part["p99"]])
    return right


def summary_rebases_the_records(records):
    """Moves every record's clock to start at the first arrival by writing into the records
    (`r.arrival_time -= t0`, ...): durations as before, but the records it was handed come back changed."""
    t0 = min((r.arrival_time for r in records), default=0.0)
    for r in records:
        r.arrival_time -= t0
        r.first_token_time = None if r.first_token_time is None else r.first_token_time - t0
        r.finish_time = None if r.finish_time is None else r.finish_time - t0
    return _summary(records)


def _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, *, initial=None, refill="each",
                 extra=0, order="sent", rng_per_request=False, throttle=False):
    engine = make_engine()
    rng = random.Random(seed)
    sent, done, finish_order = [], {}, []
    backlog = [0]  # users who are free but wait for the server to have room (throttle)
    limit = num_requests + extra

    def send():
        nonlocal rng
        if rng_per_request:
            rng = random.Random(seed)
        prompt, params = make_prompt(rng)
        sent.append(engine.add_request(prompt, params))

    for _ in range(min(num_users if initial is None else initial, limit)):
        send()
    while len(done) < len(sent) or len(sent) < limit:
        if not engine.has_unfinished_requests:
            break
        if throttle and backlog[0] and not engine.scheduler.waiting:
            for _ in range(backlog[0]):
                if len(sent) < limit:
                    send()
            backlog[0] = 0
        finished_now = [o for o in engine.step() if o.finished and o.request_id not in done]
        for o in finished_now:
            done[o.request_id] = o
            finish_order.append(o.request_id)
        if throttle:
            backlog[0] += len(finished_now)
            if not engine.has_unfinished_requests and len(sent) < limit:
                send()
                backlog[0] -= 1
        elif refill == "each":
            for _ in finished_now:
                if len(sent) < limit:
                    send()
        elif refill == "one" and finished_now and len(sent) < limit:
            send()
        elif refill == "wave" and len(done) == len(sent):
            for _ in range(num_users):
                if len(sent) < limit:
                    send()
    ids = finish_order if order == "finished" else sent
    return [done[i] for i in ids if i in done]


def closed_loop_all_at_once(make_engine, num_users, num_requests, make_prompt, seed):
    """Sends every request at the start: an open loop, not N users."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, initial=num_requests)


def closed_loop_waves(make_engine, num_users, num_requests, make_prompt, seed):
    """Waits for the whole wave of users to finish before anyone sends again."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, refill="wave")


def closed_loop_one_user(make_engine, num_users, num_requests, make_prompt, seed):
    """One request at a time."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, initial=1)


def closed_loop_one_refill_per_step(make_engine, num_users, num_requests, make_prompt, seed):
    """When several requests finish in one step, only one new request is sent."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, refill="one")


def closed_loop_one_extra(make_engine, num_users, num_requests, make_prompt, seed):
    """Off by one: sends num_requests + 1 requests."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, extra=1)


def closed_loop_finish_order(make_engine, num_users, num_requests, make_prompt, seed):
    """Returns the outputs in the order they finished, not the order they were sent."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, order="finished")


def closed_loop_rng_per_request(make_engine, num_users, num_requests, make_prompt, seed):
    """Creates random.Random(seed) anew for every request: every prompt is the same."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, rng_per_request=True)


def closed_loop_waits_for_a_seat(make_engine, num_users, num_requests, make_prompt, seed):
    """Client-side throttling: a free user sends only once the server has nobody waiting (hides the queue)."""
    return _closed_loop(make_engine, num_users, num_requests, make_prompt, seed, throttle=True)



def closed_loop_counts_by_identity(make_engine, num_users, num_requests, make_prompt, seed):
    """Compares counts with `is not` (identity): right up to 256, endless beyond (larger ints are
    distinct objects, so len(finished) is never num_requests)."""
    engine = make_engine()
    rng = random.Random(seed)
    order, finished = [], {}
    for _ in range(min(num_users, num_requests)):
        order.append(engine.add_request(*make_prompt(rng)))
    while len(finished) is not num_requests:
        for out in engine.step():
            if out.finished and out.request_id not in finished:
                finished[out.request_id] = out
                if len(order) < num_requests:
                    order.append(engine.add_request(*make_prompt(rng)))
    return [finished[rid] for rid in order]

MUTANTS = {
    "latency_summary": [summary_nearest_rank, summary_unsorted, summary_tpot_over_n, summary_includes_failed,
                        summary_ttft_from_scheduling, summary_truthy_times, summary_busy_time,
                        summary_counts_failed_as_completed, summary_drops_empty_answers,
                        summary_rebases_the_records, summary_percentiles_as_arrays],
    "run_closed_loop": [closed_loop_all_at_once, closed_loop_waves, closed_loop_one_user,
                        closed_loop_one_refill_per_step, closed_loop_one_extra, closed_loop_finish_order,
                        closed_loop_rng_per_request, closed_loop_waits_for_a_seat,
                        closed_loop_counts_by_identity],
}
