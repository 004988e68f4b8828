"""Chunked prefill, measured: time to first token and inter-token latency against the step's
token budget (`EngineConfig.max_num_batched_tokens`).

A big budget lets a long prompt be computed in one step: its first token comes soon, but that
step is long, and every request decoding beside it waits for it (a long gap between two of its
tokens). A small budget cuts the prompt into chunks: every step stays short, decodes keep their
pace, and the long prompt's first token comes later. `budget_sweep` measures both sides of that
trade on one workload, under the simulated clock (deterministic: the same steps cost the same
time), and is what notebook 2's exercise of the same name is held to.

    make_sweep_engine(budget, seats)   an engine with the scripted runner and a simulated GPU clock
    submit(engine, spec)               add one workload request (its arrival time, its scripted length)
    token_times(engine, specs, submit) serve specs as they arrive: {request id: [arrival, t1, t2, ...]}
    budget_sweep(budgets, specs, make_engine, submit)   one row of measurements per budget
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from course_lib.engine import LLMEngine
from course_lib.scheduler.sampling import SamplingParams
from course_lib.sim.clock import SimulatedClock
from course_lib.sim.workload import RequestSpec

CURVE_KEYS = ("budget", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")


def make_sweep_engine(budget: int, seats: int = 16, kv_tokens: int = 65536, max_model_len: int = 2048,
                      gpu: str = "H100", model_shape: str = "llama-3-8b") -> LLMEngine:
    """A continuous-batching engine with chunked prefill on, `seats` seats, a step budget of
    `budget` tokens and a pool too big to run out (so the budget alone shapes the steps): the
    scripted runner (no model) and a simulated clock pricing each step on `gpu`."""
    from course_lib.sim.simulate import make_engine_config, scripted_model_config

    config = make_engine_config(max_num_seqs=seats, max_num_batched_tokens=budget, kv_tokens=kv_tokens,
                                admission="none", max_model_len=max_model_len)
    return LLMEngine(scripted_model_config(max_model_len), config, clock=SimulatedClock(gpu, model_shape))


def submit(engine: LLMEngine, spec: RequestSpec) -> None:
    """Add `spec` to `engine` as arriving at `spec.arrival_time`; it stops after `spec.output_len` tokens."""
    engine.add_request([5] * spec.prompt_len, SamplingParams(max_tokens=spec.output_len, ignore_eos=False),
                       request_id=spec.request_id, arrival_time=spec.arrival_time,
                       scripted_output_len=spec.output_len)


def token_times(engine: LLMEngine, specs: Sequence[RequestSpec],
                submit: Callable[[LLMEngine, RequestSpec], None] = submit) -> dict[str, list[float]]:
    """Serve `specs`, each entering the engine once the clock reaches its arrival time (an idle
    engine jumps to the next arrival). Returns each request's arrival time followed by the time
    of every token it produced (the end of the step that produced it)."""
    clock = engine.clock
    queue = sorted(specs, key=lambda s: s.arrival_time or 0.0)
    times: dict[str, list[float]] = {}
    i = 0
    while i < len(queue) or engine.has_unfinished_requests:
        while i < len(queue) and (queue[i].arrival_time or 0.0) <= clock.now():
            submit(engine, queue[i])
            times[queue[i].request_id] = [queue[i].arrival_time or 0.0]
            i += 1
        if not engine.has_unfinished_requests:
            clock.wait_until(queue[i].arrival_time or 0.0)
            continue
        for out in engine.step():
            times[out.request_id].extend([clock.now()] * len(out.new_token_ids))
    return times


def _ms_percentile(values: list[float], q: float) -> float:
    return float(1e3 * np.percentile(values, q)) if values else float("nan")


def latency_row(budget: int, times: dict[str, list[float]]) -> dict:
    """TTFT (arrival to first token) per request, and inter-token gaps (between consecutive
    tokens of one request, all requests pooled), as p50 / p99 in milliseconds."""
    ttft = [t[1] - t[0] for t in times.values() if len(t) > 1]
    gaps = [later - earlier for t in times.values() for earlier, later in zip(t[1:], t[2:])]
    return {"budget": budget, "ttft_p50_ms": _ms_percentile(ttft, 50), "ttft_p99_ms": _ms_percentile(ttft, 99),
            "itl_p50_ms": _ms_percentile(gaps, 50), "itl_p99_ms": _ms_percentile(gaps, 99)}


def budget_sweep(budgets: Sequence[int], specs: Sequence[RequestSpec],
                 make_engine: Callable[[int], LLMEngine] = make_sweep_engine,
                 submit: Callable[[LLMEngine, RequestSpec], None] = submit) -> list[dict]:
    """One row per budget, in the order given: `latency_row(budget, token_times(...))` on a fresh
    engine `make_engine(budget)` serving `specs`."""
    return [latency_row(b, token_times(make_engine(b), specs, submit)) for b in budgets]
