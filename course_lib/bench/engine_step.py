"""`python -m course_lib bench engine --profile`: where the time of one course_lib decode step goes.

The engine and its runner record their own phases (`LLMEngine.profile_steps()`, see
course_lib/step_profile.py); this serves `running` requests to their decode steps, reads the rows
and prints each phase's median beside the step time measured around `engine.step()` (the phases
cover all of the step but the call into it, so the two agree to within a few microseconds).

The table's rows, from the recorded phases:

- schedule: `scheduler.next_step()`;
- build_batch: the runner's Python that turns the schedule into tensors (everything in `execute`
  outside the model and the sampler);
- forward_attention: writing K/V into the pages and paged attention, all layers (eager forward);
- forward_rest: the rest of the eager forward pass (embeddings, norms, RoPE, projections, MLP, lm_head);
- forward_cpu: instead of those two, the whole forward pass in one C call (EngineConfig.forward "cpu");
- sample: the sampler;
- update: the scheduler's update after the runner (tokens, stop checks, KV commit) and the
  engine's record of the step (stats, outputs).
"""
from __future__ import annotations

import random
import statistics
import time

import torch

from ..engine import LLMEngine
from ..engine_config import EngineConfig
from ..scheduler.sampling import SamplingParams
from ..step_profile import PHASES as RECORDED_PHASES
from .models import load_average, load_model

PHASES = ("schedule", "build_batch", "forward_attention", "forward_rest", "forward_cpu", "sample", "update")


def table_phases(row: dict[str, int]) -> dict[str, int]:
    """One recorded `StepProfile` row as the table's phases (nanoseconds; they sum to the row's)."""
    return {
        "schedule": row["schedule"],
        "build_batch": row["prepare"],
        "forward_attention": row["attention"],
        "forward_rest": row["forward"] - row["attention"] - row["c_forward"],
        "forward_cpu": row["c_forward"],
        "sample": row["sample"],
        "update": row["update"],
    }


def profile_engine_step(model=None, running: int = 64, prompt_len: int = 16, steps: int = 40,
                        config: EngineConfig | None = None, threads: int | None = 1, cprofile_top: int = 0) -> dict:
    """Time `steps` course_lib decode steps with `running` requests, split into the phases the
    engine records. Medians over the steps, in microseconds; `recorded_share` is the median of
    (sum of the recorded phases) / (the step measured from outside)."""
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        model = model if model is not None else load_model("tiny")[0]
        config = config or EngineConfig(max_num_seqs=max(64, running))
        engine = LLMEngine(model, config)
        rng = random.Random(0)
        vocab = model.config.vocab_size
        for _ in range(running):
            engine.add_request([rng.randrange(3, vocab) for _ in range(prompt_len)],
                               SamplingParams(max_tokens=steps + 12, ignore_eos=True))
        # Prefill everyone, then a few decode steps to settle.
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
            engine.step()
        for _ in range(4):
            engine.step()
        if len(engine.scheduler.running) != running:
            raise RuntimeError(f"expected {running} running requests, got {len(engine.scheduler.running)}")

        profiler = None
        if cprofile_top:
            import cProfile

            profiler = cProfile.Profile()
        clock, measured = time.perf_counter_ns, []
        profile = engine.profile_steps()
        try:
            for _ in range(steps):
                t = clock()
                if profiler:
                    profiler.enable()
                engine.step()
                if profiler:
                    profiler.disable()
                measured.append(clock() - t)
        finally:
            engine.profile_steps(False)
        rows = [{**table_phases(row), "total": total} for row, total in zip(profile.rows, measured)]
        recorded = [sum(row[p] for p in RECORDED_PHASES) / total for row, total in zip(profile.rows, measured)]
        med = {k: statistics.median(r[k] for r in rows) / 1000 for k in (*PHASES, "total")}
        result = {"running": running, "steps": steps, "threads": torch.get_num_threads(),
                  "attention_backend": engine.runner.attention_backend, "forward": engine.runner.forward,
                  "context_len_start": prompt_len + 4, "median_us": med,
                  "share": {k: med[k] / med["total"] for k in PHASES},
                  "recorded_share": statistics.median(recorded),
                  "tok_s": running / (med["total"] / 1e6), "load_average": load_average()}
        if profiler is not None:
            import io
            import pstats

            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(cprofile_top)
            result["cprofile"] = buf.getvalue()
        return result
    finally:
        torch.set_num_threads(old_threads)


def format_profile(p: dict) -> str:
    lines = [f"course_lib decode step, {p['running']} running requests, {p['threads']} thread(s), "
             f"attention {p['attention_backend']}, forward {p['forward']}, median of {p['steps']} steps "
             f"(load average {p['load_average']}):",
             ""]
    for k in (*PHASES, "total"):
        share = "" if k == "total" else f"{p['share'][k] * 100:5.1f}%"
        lines.append(f"  {k:<18} {p['median_us'][k]:>9.0f} us  {share}")
    lines.append(f"  -> {p['tok_s']:.0f} decode tokens/s; the recorded phases cover "
                 f"{p['recorded_share'] * 100:.1f}% of the step timed from outside")
    if "cprofile" in p:
        lines += ["", p["cprofile"]]
    return "\n".join(lines)
