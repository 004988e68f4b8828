"""`python -m course_lib bench engine --speculative`: tokens/s with and without speculative decoding.

The same engine (`LLMEngine`, default `EngineConfig`, greedy, float32) serves the same prompts
with `max_num_seqs` set to each concurrency level (1, 8 and 64 requests at once by default):
once without speculation and once per drafter (`ngram`: prompt lookup; `draft`: the model's
first layers), `num_speculative_tokens` drafts per decode step. With the tiny model the prompts
are its task prompts (`course_lib.model.tasks`, answered until EOS), two workloads by default:
"mixed" (every task kind, as `bench engine` serves) and "repeat" ("repeat: x 7" -> "xxxxxxx",
the kind whose answer repeats what came before: the n-gram drafter's best case). Any task kind
names a workload of its own. A random model gets random prompts (nothing for n-grams to match).

Each repeat runs every (level, drafter) pair back to back, the run without speculation first,
so a ratio compares runs made seconds apart on a shared, noisy CPU. Reported per pair: the
median tokens/s and its spread (min-max over repeats), the median of the per-repeat ratios to
the run without speculation (and their min-max), the draft acceptance rate (drafts kept /
drafted), tokens per drafted step (1 + kept / drafted rows), engine steps, and how many answers
equal the answers without speculation (greedy: all of them, barring a float32 near-tie that the
batched verification rows break differently). Building the engine is not timed.

On this CPU a step's time grows with the rows it computes, even for one request (there is no
idle arithmetic to fill as on a memory-bound GPU), so a drafted row costs nearly 1 + k plain
rows: speculation gains only where the drafts are kept often and the per-step overhead is a
large share of the step (few requests).
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import time

import torch

from ..engine import LLMEngine
from ..engine_config import OPTIONS, EngineConfig
from ..scheduler.sampling import SamplingParams
from .models import load_average, load_model

CONCURRENCY = (1, 8, 64)
DRAFTERS = tuple(d for d in OPTIONS["speculative"] if d != "none")  # ("ngram", "draft")


WORKLOADS = ("mixed", "repeat")


def make_prompts(model, tokenizer, num_prompts: int, workload: str = "mixed",
                 seed: int = 0) -> tuple[list[list[int]], str]:
    """(prompts, what they are): the tiny model's task prompts of `workload` ("mixed": every kind, or
    one task kind), or random ones for a model without a tokenizer."""
    from ..model.tasks import TASK_KINDS, sample_task

    if workload != "mixed" and workload not in TASK_KINDS:
        raise ValueError(f"workload must be 'mixed' or a task kind ({', '.join(TASK_KINDS)}), got {workload!r}")
    rng = random.Random(seed)
    if tokenizer is not None:
        kind = None if workload == "mixed" else workload
        what = "task prompts of every kind" if kind is None else f"{kind!r} task prompts"
        return [tokenizer.encode_prompt(sample_task(rng, kind)[0]) for _ in range(num_prompts)], what
    vocab = model.config.vocab_size
    return ([[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))] for _ in range(num_prompts)],
            "random prompts of 4-40 tokens")


def run_once(model, prompts: list[list[int]], max_tokens: int, config: EngineConfig) -> dict:
    """One timed `generate` of every prompt (greedy, stop on EOS), with the scheduler's draft counts."""
    engine = LLMEngine(model, config)  # allocating the caches is setup, not timed
    params = SamplingParams(max_tokens=max_tokens)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    s = engine.scheduler
    return {"seconds": seconds, "answers": [list(o.token_ids) for o in outs], "steps": len(engine.step_stats),
            "num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens}


def _spread(values: list[float]) -> list[float]:
    return [min(values), max(values)]


def bench_speculative(model, prompts: list[list[int]], max_tokens: int = 64, concurrency=CONCURRENCY,
                      drafters=DRAFTERS, num_speculative_tokens: int = 3, draft_layers: int = 1, repeats: int = 3,
                      config: EngineConfig | None = None, warmup: bool = True) -> list[dict]:
    """For each concurrency level, the run without speculation and one per drafter, `repeats` times,
    interleaved. Returns one dict per level (JSON-ready): {"concurrency", "runs": {name: ...}}."""
    unknown = set(drafters) - set(DRAFTERS)
    if unknown:
        raise ValueError(f"drafters must be among {DRAFTERS}, got {list(drafters)}")
    if not concurrency or min(concurrency) < 1 or repeats < 1:
        raise ValueError(f"need concurrency levels >= 1 and repeats >= 1, got {list(concurrency)} and {repeats}")
    base = config or EngineConfig()
    names = ("none", *drafters)

    def config_for(level: int, name: str) -> EngineConfig:
        spec = {} if name == "none" else dict(num_speculative_tokens=num_speculative_tokens, draft_layers=draft_layers)
        return dataclasses.replace(base, max_num_seqs=level, speculative=name, **spec)

    if warmup:  # lazy initialisation (the C forward, the allocator) stays off the clock
        for name in names:
            run_once(model, prompts[:2], min(4, max_tokens), config_for(min(concurrency), name))
    runs = {(level, name): [] for level in concurrency for name in names}
    for _ in range(repeats):
        for level in concurrency:
            for name in names:
                runs[level, name].append(run_once(model, prompts, max_tokens, config_for(level, name)))

    results = []
    for level in concurrency:
        plain = runs[level, "none"]
        entry = {"concurrency": level, "runs": {}}
        for name in names:
            rs = runs[level, name]
            tokens = sum(len(a) for a in rs[-1]["answers"])
            tok_s = [sum(len(a) for a in r["answers"]) / r["seconds"] for r in rs]
            ratios = [t / (sum(len(a) for a in p["answers"]) / p["seconds"]) for t, p in zip(tok_s, plain)]
            last = rs[-1]
            same = sum(a == b for a, b in zip(last["answers"], plain[-1]["answers"])) / len(prompts)
            entry["runs"][name] = {
                "output_tokens": tokens, "seconds": [r["seconds"] for r in rs], "tok_s": tok_s,
                "median_tok_s": statistics.median(tok_s), "tok_s_spread": _spread(tok_s),
                "ratio": statistics.median(ratios), "ratio_spread": _spread(ratios),
                "steps": last["steps"], "num_drafts": last["num_drafts"], "num_draft_tokens": last["num_draft_tokens"],
                "num_accepted_tokens": last["num_accepted_tokens"],
                "acceptance_rate": (last["num_accepted_tokens"] / last["num_draft_tokens"]
                                    if last["num_draft_tokens"] else None),
                "tokens_per_drafted_step": (1 + last["num_accepted_tokens"] / last["num_drafts"]
                                            if last["num_drafts"] else None),
                "same_answers": same,
            }
        results.append(entry)
    return results


def run_benchmark(model_kind: str = "tiny", num_prompts: int = 128, max_tokens: int = 64, repeats: int = 3,
                  threads: int | None = 1, seed: int = 0, concurrency=CONCURRENCY, drafters=DRAFTERS,
                  num_speculative_tokens: int = 3, draft_layers: int = 1, attention: str = "auto",
                  forward: str = "auto", workloads=WORKLOADS) -> dict:
    """The whole `bench engine --speculative`: one JSON-ready dict."""
    from ..runner import resolve_backend, resolve_forward

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        model, tokenizer, kind = load_model(model_kind, seed)
        if tokenizer is None:  # random prompts: one workload (the task kinds need the tiny model's tokenizer)
            workloads = workloads[:1]
        served = {w: make_prompts(model, tokenizer, num_prompts, w, seed) for w in workloads}
        config = EngineConfig(attention_backend=attention, forward=forward)
        backend = resolve_backend(config.attention_backend, model.device, model.dtype)
        load = load_average()
        results = [{"workload": w, "prompts": what,
                    "levels": bench_speculative(model, prompts, max_tokens, concurrency, drafters,
                                                num_speculative_tokens, draft_layers, repeats, config)}
                   for w, (prompts, what) in served.items()]
        return {
            "model": kind, "num_prompts": num_prompts, "max_tokens": max_tokens,
            "repeats": repeats, "threads": torch.get_num_threads(), "dtype": "float32",
            "attention_backend": backend, "forward": resolve_forward(config.forward, backend, model.dtype),
            "num_speculative_tokens": num_speculative_tokens, "draft_layers": draft_layers,
            "torch": torch.__version__, "load_average_before": load, "load_average_after": load_average(),
            "workloads": results,
        }
    finally:
        torch.set_num_threads(old_threads)


def format_table(result: dict) -> str:
    lines = [f"model: {result['model']}, {result['num_prompts']} prompts per workload, max_tokens "
             f"{result['max_tokens']}, greedy, float32, {result['threads']} thread(s), forward {result['forward']}, "
             f"k = {result['num_speculative_tokens']} drafts (draft model: the first {result['draft_layers']} "
             f"layer(s)), median of {result['repeats']} [min-max]; load average {result['load_average_before']} "
             f"-> {result['load_average_after']}", ""]
    header = (f"{'workload':<8} {'concurrent':>10}  {'drafter':<7} {'tokens':>6} {'tok/s':>7} {'[min-max]':>13} {'vs none':>7} "
              f"{'[min-max]':>13} {'accepted':>8} {'tok/drafted step':>16} {'steps':>5} {'same answers':>12}")
    lines += [header, "-" * len(header)]
    for w, level in ((w, level) for w in result["workloads"] for level in w["levels"]):
        for name, r in level["runs"].items():
            lo, hi = r["tok_s_spread"]
            ratio = "" if name == "none" else f"{r['ratio']:.2f}x"
            ratio_spread = "" if name == "none" else f"[{r['ratio_spread'][0]:.2f}-{r['ratio_spread'][1]:.2f}]"
            accepted = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}"
            per_step = "" if r["tokens_per_drafted_step"] is None else f"{r['tokens_per_drafted_step']:.2f}"
            same = "" if name == "none" else f"{r['same_answers']:.1%}"
            lines.append(f"{w['workload']:<8} {level['concurrency']:>10}  {name:<7} {r['output_tokens']:>6} {r['median_tok_s']:>7.0f} "
                         f"{f'[{lo:.0f}-{hi:.0f}]':>13} {ratio:>7} {ratio_spread:>13} {accepted:>8} {per_step:>16} "
                         f"{r['steps']:>5} {same:>12}")
        lines.append("")
    for w in result["workloads"]:
        lines.append(f"{w['workload']}: {w['prompts']}")
    lines.append("vs none: tokens/s over the run without speculation at the same concurrency, median of the "
                 "per-repeat ratios;\naccepted: drafts kept / drafted; tok/drafted step: 1 + kept / drafted rows; "
                 "same answers: greedy answers equal to those without speculation.")
    return "\n".join(lines)
