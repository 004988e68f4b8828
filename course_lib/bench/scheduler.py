"""`python -m course_lib bench scheduler`: what one engine step costs without a model.

The engine runs on a `ModelConfig` (the scripted runner computes nothing), so the time of
`engine.step()` is pure per-step overhead: scheduling, the KV manager's allocations, the
runner's bookkeeping, the engine's update (tokens, stop checks, stats, outputs). This is the
Python a real model step pays on top of its forward pass.

Two steady states, `running` requests each:

- **decode**: every request prefilled and decoding, nobody finishes (one new token each per
  step, a new page every `page_size` steps);
- **churn**: requests end at scripted lengths and are replaced at once, so every step also
  admits, prefills and retires a few.

Nothing is excluded from the timing of a step; adding the replacement requests happens
between steps and is not timed.
"""
from __future__ import annotations

import random
import statistics
import time

from ..engine import LLMEngine
from ..engine_config import EngineConfig
from ..model.config import ModelConfig
from ..scheduler.sampling import SamplingParams
from .engine import TINY_SHAPE, _load_average

MODES = ("decode", "churn")


def python_call_ns(n: int = 200_000) -> float:
    """CPU nanoseconds per empty Python function call on this machine right now: a yardstick to
    scale the step times by (a recent laptop does one in about 30-60 ns)."""
    def f():
        pass

    best = float("inf")
    for _ in range(3):
        c = time.thread_time_ns()
        for _ in range(n):
            f()
        best = min(best, (time.thread_time_ns() - c) / n)
    return best


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def bench_scheduler(running: int = 256, steps: int = 500, mode: str = "decode", prompt_len: int = 32,
                    page_size: int = 16, mean_output_len: int = 64, seed: int = 0, warmup_steps: int = 20) -> dict:
    """Per-step time of `engine.step()` with `running` requests in steady state (microseconds)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if running < 1 or steps < 1:
        raise ValueError(f"need running >= 1 and steps >= 1, got {running} and {steps}")
    rng = random.Random(seed)
    if mode == "decode":
        # Early requests decode while later ones still prefill (at least budget - running = running prompt
        # tokens a step, so for at most prompt_len steps): room for that too, so that nobody finishes.
        max_tokens = warmup_steps + steps + prompt_len + 8
        max_len = prompt_len + max_tokens + 1
    else:
        max_tokens = 2 * mean_output_len
        max_len = prompt_len + max_tokens + 1
    mc = ModelConfig(**{**TINY_SHAPE, "max_position_embeddings": max_len})
    pages_per_request = -(-max_len // page_size)
    # A token budget of at least 2 x running leaves room to admit while everyone decodes (512 = the default).
    config = EngineConfig(page_size=page_size, num_pages=running * pages_per_request + 1, max_num_seqs=running,
                          max_num_batched_tokens=max(512, 2 * running))
    engine = LLMEngine(mc, config)
    vocab = mc.vocab_size
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=mode == "decode")

    def add_one():
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        out_len = max_tokens if mode == "decode" else rng.randint(1, max_tokens)
        engine.add_request(prompt, params, scripted_output_len=out_len)

    for _ in range(running):
        add_one()
    # Prefill everyone (chunked, max_num_batched_tokens per step), then settle.
    guard = 0
    sched = engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        engine.step()
        guard += 1
        if guard > 100 * running:
            raise RuntimeError("prefill did not finish (bug)")
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    sched = engine.scheduler
    times, cpu_times, sched_times, running_counts, finished = [], [], [], [], 0
    acc = [0]
    original = sched.schedule

    def timed_schedule():
        t = clock()
        try:
            return original()
        finally:
            acc[0] += clock() - t

    for i in range(warmup_steps + steps):
        if mode == "churn":  # top the batch up again (not timed)
            while len(sched.running) + len(sched.waiting) < running:
                add_one()
        sched.schedule = timed_schedule
        acc[0] = 0
        c, t = cpu_clock(), clock()
        outs = engine.step()
        elapsed, cpu = clock() - t, cpu_clock() - c
        del sched.schedule
        if i >= warmup_steps:
            times.append(elapsed / 1000)
            cpu_times.append(cpu / 1000)
            sched_times.append(acc[0] / 1000)
            running_counts.append(len(sched.running))
            finished += sum(o.finished for o in outs)
    if mode == "decode" and min(running_counts) != running:
        raise RuntimeError(f"decode steady state lost requests: {min(running_counts)} of {running} running")
    return {
        "mode": mode, "running": running, "steps": steps, "page_size": page_size, "prompt_len": prompt_len,
        "mean_running": statistics.fmean(running_counts), "finished_per_step": finished / steps,
        "step_us": {"median": statistics.median(times), "p99": _percentile(times, 0.99),
                    "mean": statistics.fmean(times), "max": max(times)},
        # CPU time of this thread during the step: what the step costs when the CPU is not shared.
        "step_cpu_us": {"median": statistics.median(cpu_times), "p99": _percentile(cpu_times, 0.99)},
        "schedule_us": {"median": statistics.median(sched_times), "p99": _percentile(sched_times, 0.99)},
        "load_average": _load_average(), "python_call_ns": python_call_ns(),
    }


def format_results(results: list[dict]) -> str:
    header = (f"{'mode':<7} {'running':>7} {'steps':>6} {'step median':>12} {'step p99':>10} {'step mean':>10} "
              f"{'cpu median':>11} {'cpu p99':>9} {'schedule med':>13} {'done/step':>9}")
    lines = ["engine.step() with the scripted runner (no model): the per-step overhead, microseconds", "",
             header, "-" * len(header)]
    for r in results:
        s = r["step_us"]
        lines.append(f"{r['mode']:<7} {r['mean_running']:>7.0f} {r['steps']:>6} {s['median']:>10.0f}us "
                     f"{s['p99']:>8.0f}us {s['mean']:>8.0f}us {r['step_cpu_us']['median']:>9.0f}us "
                     f"{r['step_cpu_us']['p99']:>7.0f}us {r['schedule_us']['median']:>11.0f}us "
                     f"{r['finished_per_step']:>9.2f}")
    lines.append("")
    lines.append("step: wall clock of engine.step(); cpu: this thread's CPU time in it (what a machine of one's own "
                 "would see)")
    lines.append(f"goal: < 1000 us per step at 256 running; load average {results[-1]['load_average']}; "
                 f"yardstick: {results[-1]['python_call_ns']:.0f} ns (cpu) per empty Python call")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m course_lib bench scheduler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--running", type=int, default=256, help="requests in the batch")
    parser.add_argument("--steps", type=int, default=500, help="timed steps per mode")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    modes = MODES if args.mode == "both" else (args.mode,)
    try:
        results = [bench_scheduler(args.running, args.steps, m, args.prompt_len, args.page_size, seed=args.seed)
                   for m in modes]
    except ValueError as err:
        parser.error(str(err))
    print(format_results(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results if len(results) > 1 else results[0], f, indent=2)
            f.write("\n")
    return 0
