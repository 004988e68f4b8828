"""Notebook 07, `break_it_config`: the experiment the student designs must break the engine as its
question asks; run_break_it and failure_reasons show the notebook what happened."""
from __future__ import annotations

from autograder._checking import broke, call, check, expect, kind_of, plain_float, show

# The experiment's fixed parts (the notebook states them): closed-loop users with the simulator's
# default chat-like lengths, pages of 16 tokens, the scripted runner on the simulated H100.
BREAK_IT_REQUESTS = 200


BREAK_IT_PAGE_SIZE = 16


BREAK_IT_LIMITS = {"users": (1, 256), "kv_tokens": (16, 131072), "max_tokens": (1, 1024)}


MID_GENERATION = "mid-generation"  # the engine's error for a request that could not grow


def run_break_it(config: dict, admission: str, preemption: str, seed: int):
    """One run of the experiment (the notebook calls this too): `config` as break_it_config returns it."""
    from course_lib.sim.simulate import make_engine_config, simulate
    from course_lib.sim.workload import ClosedLoopUsers

    engine_config = make_engine_config(kv_tokens=config["kv_tokens"], page_size=BREAK_IT_PAGE_SIZE,
                                       admission=admission, preemption=preemption,
                                       watermark=config.get("watermark", 0.05))
    return simulate(engine_config, ClosedLoopUsers(config["users"], BREAK_IT_REQUESTS, seed=seed),
                    max_tokens=config["max_tokens"], seed=seed, progress=False)


def failure_reasons(result) -> dict:
    """{'mid-generation': n, 'refused: ...': n}: why the failed requests of a run failed."""
    reasons: dict[str, int] = {}
    for r in result.requests:
        if r.finish_reason == "error":
            error = r.error or ""
            why = (MID_GENERATION if MID_GENERATION in error else
                   "refused: larger than the whole pool" if "whole pool" in error else f"other: {error[:60]}")
            reasons[why] = reasons.get(why, 0) + 1
    return reasons


def _validated_config(got):
    name = "break_it_config()"
    expect(type(got) is dict, lambda: f"{name} must return a dict with keys users, kv_tokens, max_tokens, watermark; "
                                      f"got {kind_of(got)}", rule="values in range")
    for key in ("users", "kv_tokens", "max_tokens", "watermark"):
        expect(key in got, lambda: f"{name} needs the key {key!r} (got keys {sorted(show(k) for k in got)})",
               rule="values in range")
    for key, (lo, hi) in BREAK_IT_LIMITS.items():
        value = got[key]
        expect(type(value) is int and lo <= value <= hi,
               lambda: f"{name}[{key!r}] must be an int in [{lo}, {hi}], got {show(value)}", rule="values in range")
    expect(got["kv_tokens"] % BREAK_IT_PAGE_SIZE == 0,
           f"{name}['kv_tokens'] must be whole pages of {BREAK_IT_PAGE_SIZE} tokens, got {got['kv_tokens']}",
           rule="values in range")
    w = plain_float(got["watermark"])
    expect(w is not None and 0.0 <= w < 1.0,
           lambda: f"{name}['watermark'] must be a fraction of the pool in [0, 1), got {show(got['watermark'])}",
           rule="values in range")
    return {"users": got["users"], "kv_tokens": got["kv_tokens"], "max_tokens": got["max_tokens"], "watermark": w}


BREAK_IT_LONGEST_PROMPT = 1024  # the workload's prompt lengths are capped here (the notebook states it)


def largest_request_slots(max_tokens: int) -> int:
    """KV slots the largest request the workload can send needs: its prompt and every answer token but
    the last (whose K/V is never written), in whole pages."""
    slots = BREAK_IT_LONGEST_PROMPT + max_tokens - 1
    return -(-slots // BREAK_IT_PAGE_SIZE) * BREAK_IT_PAGE_SIZE


@check("break_it_config")
def check_break_it_config(impl, seed, allow_reference):
    got = call("break_it_config()", impl)
    config = _validated_config(got)
    shown = (f"users={config['users']}, kv_tokens={config['kv_tokens']}, max_tokens={config['max_tokens']}, "
             f"watermark={config['watermark']} (workload seed {seed}, {BREAK_IT_REQUESTS} requests)")
    largest = largest_request_slots(config["max_tokens"])
    expect(config["kv_tokens"] >= largest,
           f"break_it_config: {shown}: the pool must hold the largest request the workload can send, a "
           f"{BREAK_IT_LONGEST_PROMPT}-token prompt + max_tokens {config['max_tokens']} - 1 = "
           f"{BREAK_IT_LONGEST_PROMPT + config['max_tokens'] - 1} KV slots, {largest} in whole pages of "
           f"{BREAK_IT_PAGE_SIZE}; kv_tokens is {config['kv_tokens']}. A smaller pool may pass a seed that happens "
           "to draw no such prompt, but it refuses that request at the door on another: the failure it shows is a "
           "configuration error, not the one this experiment is about", rule="holds the largest request")
    broken = run_break_it(config, "none", "fail", seed)
    reasons = failure_reasons(broken)
    mid = reasons.get(MID_GENERATION, 0)
    if mid == 0:
        refused = sum(n for why, n in reasons.items() if why != MID_GENERATION)
        peak = max((s.kv_allocated_slots for s in broken.steps), default=0)
        if refused:
            broke("breaks without control",
                  f"break_it_config: with no admission control and preemption off, {shown}: no request failed "
                  f"mid-generation; {refused} were refused at the door because one request (a prompt of up to "
                  f"1,024 tokens + max_tokens) does not fit a pool of {config['kv_tokens']} tokens. That is not the "
                  "failure the experiment is about: make the pool hold any one request, and the load outgrow it")
        broke("breaks without control",
              f"break_it_config: with no admission control and preemption off, {shown}: every request completed "
              f"(the pool's peak use was {peak} of {config['kv_tokens']} slots). Choose a load and a max_tokens whose "
              "answers outgrow the pool once everyone is admitted")
    safe = run_break_it(config, "watermark", "recompute", seed)
    reasons = failure_reasons(safe)
    if reasons:
        broke("survives with the watermark",
              f"break_it_config: with watermark {config['watermark']} and preemption by recompute, {shown}: "
              f"{sum(reasons.values())} request(s) failed ({reasons}); expected none. Recompute cannot save a request "
              "that does not fit the pool at all: the pool must hold the largest request the workload can send")
    expect(safe.summary["requests_completed"] == BREAK_IT_REQUESTS,
           f"break_it_config: with watermark and preemption, {shown}: {safe.summary['requests_completed']} of "
           f"{BREAK_IT_REQUESTS} requests completed", rule="survives with the watermark")
