"""The simulator's prediction for a load run: the same workload through `simulate()`, priced by a
roofline clock fitted to this machine.

The simulator never runs the model: its scripted runner stops each request at the workload's
length (what `ignore_eos` + `max_tokens` make the server do), and a clock charges every step
`overhead + FLOPs / peak`. For a GPU the peak is the datasheet's; here both numbers are fitted
to a few steps of the real engine timed in this process (`fit_cpu`), so a prediction is "this
engine on this CPU, without HTTP, if a step costs what the fit says". What the server measures
beyond it is the price of HTTP, of sharing the CPU with the load generator, and of the fit's error.

A tiny model's weights sit in the CPU's cache, so the fitted clock is compute-bound (memory
bandwidth set out of reach); attention FLOPs are counted as the roofline counts them.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from course_lib.engine import LLMEngine
from course_lib.scheduler.sampling import SamplingParams
from course_lib.sim.clock import SimulatedClock
from course_lib.sim.hardware import GPUSpec, ModelShape
from course_lib.sim.roofline import roofline_cost
from course_lib.sim.workload import RequestSpec, make_prompt_tokens

UNREACHABLE_BANDWIDTH = 1e15  # bytes/s: cache-resident weights never make a tiny model's step memory-bound


@dataclasses.dataclass(frozen=True)
class FittedCPU:
    """step time = overhead_s + flops / peak_flops, fitted to measured steps."""

    overhead_s: float
    peak_flops: float
    shape: ModelShape
    samples: tuple = ()  # (flops, measured seconds) per calibration point
    max_model_len: int | None = None  # the served engine's context: the prediction clips to it too

    def spec(self) -> GPUSpec:
        return GPUSpec("this CPU (fitted)", self.peak_flops, UNREACHABLE_BANDWIDTH, 0)

    def clock(self) -> SimulatedClock:
        return SimulatedClock(self.spec(), self.shape, overhead_s=self.overhead_s)

    def step_time(self, stats) -> float:
        return self.clock().charge(stats)

    def __str__(self) -> str:
        return (f"step = {self.overhead_s * 1e3:.2f} ms + FLOPs / {self.peak_flops / 1e9:.1f} GFLOP/s "
                f"(fitted on {len(self.samples)} step sizes)")


UNFITTED = GPUSpec("unit", 1.0, 1.0, 0)  # only the FLOP count of roofline_cost is used


def _flops(stats, shape: ModelShape) -> float:
    return roofline_cost(UNFITTED, shape, num_tokens=stats.num_prefill_tokens + stats.num_decode_tokens,
                         num_padded_tokens=stats.num_padded_tokens,
                         attention_context_tokens=stats.attention_context_tokens).flops


def fit_cpu(model, engine_config, batch_sizes=(1, 4, 16, 32, 64), prompt_len: int = 16, steps: int = 12,
            seed: int = 0) -> FittedCPU:
    """Time decode steps of `batch_sizes` requests (median of `steps` each) and one prefill step,
    then fit overhead and peak. Takes about a second for the tiny model."""
    shape = ModelShape.from_config(model.config, name="served model")
    seats = engine_config.max_num_seqs
    points, max_model_len = [], None
    for bs in sorted({min(b, seats) for b in batch_sizes}):
        engine = LLMEngine(model, dataclasses.replace(engine_config, enable_prefix_caching=False))
        max_model_len = engine.max_model_len
        for i in range(bs):
            spec = RequestSpec(f"c{bs}-{i}", prompt_len, 0, 0.0, None)
            engine.add_request(make_prompt_tokens(spec, model.config.vocab_size, seed=seed),
                               SamplingParams(max_tokens=steps + 4, ignore_eos=True))
        prefill = None
        for _ in range(bs * prompt_len):  # the prefill, in as many chunks as the token budget needs
            engine.step()
            last = engine.step_stats[-1]
            if last.num_prefill_tokens == 0:
                break
            if prefill is None or last.num_prefill_tokens > prefill.num_prefill_tokens:
                prefill = last
        timed = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            timed.append((engine.step_stats[-1], time.perf_counter() - start))
        points.append((_flops(timed[0][0], shape), statistics.median(t for _, t in timed)))
        if prefill is not None and bs == max(min(b, seats) for b in batch_sizes):
            points.append((_flops(prefill, shape), prefill.end_time - prefill.start_time))
    return dataclasses.replace(fit_points(points, shape), max_model_len=max_model_len)


def fit_points(points, shape: ModelShape) -> FittedCPU:
    """The line `seconds = overhead + flops / peak` through (flops, seconds) points, by least
    squares on *relative* error (weights 1/y^2): a 40 ms prefill must not drown the
    sub-millisecond decodes that most steps are."""
    if len({x for x, _ in points}) < 2:
        raise ValueError(f"fitting a step cost needs points at two FLOP counts at least, got {points}")
    w = [1.0 / (y * y) for _, y in points]
    sw = sum(w)
    mean_x = sum(wi * x for wi, (x, _) in zip(w, points)) / sw
    mean_y = sum(wi * y for wi, (_, y) in zip(w, points)) / sw
    var = sum(wi * (x - mean_x) ** 2 for wi, (x, _) in zip(w, points))
    slope = sum(wi * (x - mean_x) * (y - mean_y) for wi, (x, y) in zip(w, points)) / var
    slope = max(slope, 1e-15)  # noise can tilt the line backwards: a step never gets cheaper with work
    overhead = max(0.0, mean_y - slope * mean_x)
    return FittedCPU(overhead, 1.0 / slope, shape, tuple(points))


def predict(engine_config, workload, fitted: FittedCPU, max_tokens: int = 512, seed: int = 0):
    """`simulate()` of `workload` (a fresh ClosedLoopUsers or a list of RequestSpecs) on the fitted
    clock, scripted runner: the simulator's SimResult (`.summary` has the load JSON's keys).
    The engine's context is the fitted one's unless `engine_config` names another, so that the
    prediction clips prompts and answers exactly as the server does."""
    from course_lib.sim.simulate import simulate

    engine_config = dataclasses.replace(engine_config, max_model_len=engine_config.max_model_len or fitted.max_model_len)
    return simulate(engine_config, workload, runner="scripted", clock=fitted.clock(), max_tokens=max_tokens,
                    seed=seed, progress=False, label="simulator (fitted CPU clock)")
