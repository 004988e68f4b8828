"""`python -m course_lib bench engine`: course_lib's engine against `transformers`, same weights.

Three engines serve the same prompts with the same weights (`to_hf` exports ours), greedy,
float32, the same token budget per request:

- **course_lib**: `LLMEngine` with the default `EngineConfig` (continuous batching, paged KV,
  chunked prefill) and the vectorised torch attention backend;
- **hf_continuous**: `transformers`' continuous batching (`ContinuousBatchingManager`, the
  engine behind `model.generate_batch`), sized like ours: pages of 16 tokens, the same number
  of pages, 512 tokens and 64 requests per step, no prefix sharing;
- **hf_static**: `model.generate` on one left-padded batch of all prompts with an explicit
  attention mask (never let HF guess the mask from the pad id: a prompt token equal to the pad
  id would be silently masked).

Throughput counts *useful* tokens only: each request's answer up to its own budget (and its
EOS, when the workload stops on EOS). A static batch that decodes on for its slowest member
is charged for that time. The engines run interleaved, after a warm-up, and each ratio is the
median over repeats of the ratio measured side by side, so a shared, noisy CPU moves both
sides of a ratio together. One-time setup (building a manager, allocating caches) is not
timed for any engine.

`--profile` instead answers where the time of one course_lib step goes (bench/engine_step.py,
from the phases the engine records itself), and `--speculative` compares course_lib with and
without speculative decoding at 1, 8 and 64 concurrent requests (bench/speculative.py).
"""
from __future__ import annotations

import contextlib
import logging
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..engine import LLMEngine
from ..engine_config import OPTIONS, EngineConfig
from ..model.config import ModelConfig
from ..runner import resolve_backend, resolve_forward
from ..scheduler.sampling import SamplingParams
from .engine_step import PHASES, format_profile, profile_engine_step  # noqa: F401 (the CLI's --profile; tests)
from .models import TINY_SHAPE, load_model, random_tiny_model  # noqa: F401 (bench/scheduler.py, forward.py)
from .models import load_average as _load_average

ENGINES = ("course_lib", "hf_continuous", "hf_static")


# --------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]  # each request's budget
    stop_on_eos: bool  # False: EOS is ignored, every request produces exactly its budget
    description: str = ""

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def make_workloads(model, tokenizer, num_prompts: int, max_tokens: int, seed: int = 0) -> list[Workload]:
    """The "mixed" and the "uniform" workload for `model`.

    mixed: with the tiny model, its task prompts (answers of 1 to ~120 tokens, stop on EOS);
    with a random model, random prompts of 4-40 tokens and budgets drawn from 1..max_tokens
    (EOS ignored, so the lengths are exact). uniform: every prompt 18 tokens, every answer
    exactly `max_tokens` tokens (EOS ignored): static batching's best case."""
    if num_prompts < 1 or max_tokens < 1:
        raise ValueError(f"need num_prompts >= 1 and max_tokens >= 1, got {num_prompts} and {max_tokens}")
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    if tokenizer is not None:
        from ..model.tasks import sample_task

        mixed = Workload("mixed", [tokenizer.encode_prompt(sample_task(rng)[0]) for _ in range(num_prompts)],
                         [max_tokens] * num_prompts, True, "tiny-model task prompts, stop on EOS")
        digits = "0123456789"
        uniform_prompts = [tokenizer.encode_prompt("sort: " + "".join(rng.choice(digits) for _ in range(10)))
                           for _ in range(num_prompts)]
    else:
        mixed = Workload("mixed", [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))]
                                   for _ in range(num_prompts)],
                         [rng.randint(1, max_tokens) for _ in range(num_prompts)], False,
                         f"random prompts of 4-40 tokens, answers of 1-{max_tokens} tokens")
        uniform_prompts = [[1] + [rng.randrange(3, vocab) for _ in range(17)] for _ in range(num_prompts)]
    uniform = Workload("uniform", uniform_prompts, [max_tokens] * num_prompts, False,
                       f"prompts of {len(uniform_prompts[0])} tokens, answers of exactly {max_tokens} tokens")
    return [mixed, uniform]


# --------------------------------------------------------------------------- the three engines
@dataclass
class EngineRun:
    tokens: list[list[int]]  # the useful answer of each request, in prompt order
    seconds: float  # wall clock
    cpu_seconds: float = 0.0  # CPU time of this process, all threads (less sensitive to a crowded machine)
    setup_seconds: float = 0.0  # untimed one-time setup (engine / manager construction, warm-up), for reference

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def _useful(tokens: list[int], budget: int, eos_ids: set[int]) -> list[int]:
    """An answer cut to its budget and, when EOS counts, just after the first EOS."""
    tokens = list(tokens[:budget])
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


def _eos_ids(model_config: ModelConfig, workload: Workload) -> set[int]:
    return set(model_config.eos_token_ids) if workload.stop_on_eos else set()


def run_course_lib(model, workload: Workload, config: EngineConfig | None = None) -> EngineRun:
    config = config or EngineConfig()
    setup = time.perf_counter()
    engine = LLMEngine(model, config)  # construction (cache allocation) is setup, not timed
    setup = time.perf_counter() - setup
    params = [SamplingParams(max_tokens=m, ignore_eos=not workload.stop_on_eos) for m in workload.max_tokens]
    start, cpu = time.perf_counter(), time.process_time()
    outs = engine.generate(workload.prompts, params)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    eos = _eos_ids(model.config, workload)
    return EngineRun([_useful(o.token_ids, m, eos) for o, m in zip(outs, workload.max_tokens)], seconds, cpu, setup)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' continuous batching logs an ERROR on every start on a CPU without psutil
    (it cannot read the memory breakdown; we size the cache explicitly, so it does not matter)."""
    loggers = [logging.getLogger("ContinuousBatchingLogger"), logging.getLogger("transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def hf_continuous_config(config: EngineConfig, num_pages: int):
    """transformers' ContinuousBatchingConfig sized like our engine (`num_pages` from our pool)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return ContinuousBatchingConfig(page_size=config.page_size, num_blocks=num_pages,
                                    max_batch_tokens=config.max_num_batched_tokens,
                                    max_requests_per_batch=config.max_num_seqs, allow_block_sharing=False)


def _greedy_config(hf, max_new_tokens: int, eos):
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                            pad_token_id=hf.config.pad_token_id or 0, bos_token_id=hf.config.bos_token_id)


@torch.inference_mode()
def run_hf_continuous(hf, workload: Workload, cb_config, model_config: ModelConfig) -> EngineRun:
    """transformers' continuous batching (what `generate_batch` runs), one request per prompt with
    its own budget. The manager is built, warmed up and loaded before the clock starts."""
    eos = sorted(_eos_ids(model_config, workload))
    eos_arg = (eos[0] if len(eos) == 1 else eos) if eos else -1  # -1: no EOS
    with _quiet_transformers():
        setup = time.perf_counter()
        manager = hf.init_continuous_batching(generation_config=_greedy_config(hf, max(workload.max_tokens), eos_arg),
                                              continuous_batching_config=cb_config)
        manager.warmup()
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=m, eos_token_id=eos_arg)
               for i, (p, m) in enumerate(zip(workload.prompts, workload.max_tokens))]
        results = {}
        setup = time.perf_counter() - setup
        start, cpu = time.perf_counter(), time.process_time()
        manager.start()
        try:
            while len(results) < len(ids):
                r = manager.get_result(timeout=5)
                if r is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching thread stopped early")
                    continue
                if r.is_finished():
                    if r.error is not None:
                        raise RuntimeError(f"transformers' continuous batching failed a request: {r.error}")
                    results[r.request_id] = r
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        finally:
            manager.stop(block=True, timeout=30)
            manager.destroy()
    eos_set = set(eos)
    return EngineRun([_useful(results[i].generated_tokens, m, eos_set) for i, m in zip(ids, workload.max_tokens)],
                     seconds, cpu, setup)


@torch.inference_mode()
def run_hf_static(hf, workload: Workload, model_config: ModelConfig) -> EngineRun:
    """`model.generate` over one left-padded batch of every prompt, explicit attention mask, greedy,
    up to the largest budget (a static batch runs until its last member is done)."""
    pad = hf.config.pad_token_id or 0
    width = max(len(p) for p in workload.prompts)
    ids = torch.full((len(workload.prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(workload.prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    eos = sorted(_eos_ids(model_config, workload))
    gen_cfg = _greedy_config(hf, max(workload.max_tokens), (eos[0] if len(eos) == 1 else eos) if eos else None)
    saved = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = gen_cfg.eos_token_id  # else generate() falls back to the model's EOS
    try:
        start, cpu = time.perf_counter(), time.process_time()
        out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        hf.generation_config.eos_token_id = saved
    new = out[:, width:].tolist()
    eos_set = set(eos)
    return EngineRun([_useful(t, m, eos_set) for t, m in zip(new, workload.max_tokens)], seconds, cpu)


# --------------------------------------------------------------------------- agreement
def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """requests: fraction of answers identical; tokens: fraction of token positions that agree
    before the answers first diverge (a greedy tie flips one token, and everything after it)."""
    same = sum(a == b for a, b in zip(ours, theirs))
    agree = total = 0
    for a, b in zip(ours, theirs):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        agree += n
        total += max(len(a), len(b))
    return {"requests": same / max(1, len(ours)), "tokens": agree / max(1, total)}


# --------------------------------------------------------------------------- the benchmark
@dataclass
class EngineResult:
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    setup_seconds: list[float] = field(default_factory=list)
    num_tokens: int = 0
    tokens: list[list[int]] | None = None

    def to_dict(self) -> dict:
        med, cpu = statistics.median(self.seconds), statistics.median(self.cpu_seconds)
        return {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "median_s": med, "median_cpu_s": cpu,
                "median_setup_s": statistics.median(self.setup_seconds), "output_tokens": self.num_tokens,
                "tok_s": self.num_tokens / med if med > 0 else float("inf"),
                "tok_per_cpu_s": self.num_tokens / cpu if cpu > 0 else float("inf")}


def bench_workload(model, hf, workload: Workload, repeats: int = 3, engines=ENGINES,
                   config: EngineConfig | None = None, warmup: bool = True) -> dict:
    """Run `engines` on `workload` `repeats` times, interleaved; per engine the median time and
    tokens/s, per HF engine the median side-by-side speed ratio and the token agreement."""
    config = config or EngineConfig()
    unknown = set(engines) - set(ENGINES)
    if unknown or "course_lib" not in engines:
        raise ValueError(f"engines must include 'course_lib' and be among {ENGINES}, got {list(engines)}")
    mc = model.config
    num_pages = LLMEngine(mc, config).pool.num_pages  # a scripted engine: the pool our engine would get
    cb_config = hf_continuous_config(config, num_pages) if "hf_continuous" in engines else None
    runners = {
        "course_lib": lambda w: run_course_lib(model, w, config),
        "hf_continuous": lambda w: run_hf_continuous(hf, w, cb_config, mc),
        "hf_static": lambda w: run_hf_static(hf, w, mc),
    }
    if warmup:  # first calls pay for lazy initialisation (kernels, allocator); keep them off the clock
        small = Workload(workload.name, workload.prompts[:4], [min(4, m) for m in workload.max_tokens[:4]],
                         workload.stop_on_eos)
        for name in engines:
            runners[name](small)
    results = {name: EngineResult() for name in engines}
    ratios = {name: [] for name in engines if name != "course_lib"}
    cpu_ratios = {name: [] for name in engines if name != "course_lib"}
    for _ in range(repeats):
        runs = {name: runners[name](workload) for name in engines}
        ours = runs["course_lib"]
        for name, run in runs.items():
            res = results[name]
            res.seconds.append(run.seconds)
            res.cpu_seconds.append(run.cpu_seconds)
            res.setup_seconds.append(run.setup_seconds)
            res.num_tokens, res.tokens = run.num_tokens, run.tokens
            if name != "course_lib":
                ratios[name].append((ours.num_tokens / ours.seconds) / (run.num_tokens / run.seconds))
                cpu_ratios[name].append((ours.num_tokens / max(ours.cpu_seconds, 1e-9))
                                        / (run.num_tokens / max(run.cpu_seconds, 1e-9)))
    out = {
        "workload": workload.name, "description": workload.description, "num_prompts": len(workload.prompts),
        "prompt_tokens": workload.num_prompt_tokens, "budget_tokens": sum(workload.max_tokens),
        "engines": {name: r.to_dict() for name, r in results.items()},
        "speedup": {name: statistics.median(r) for name, r in ratios.items()},  # wall-clock tok/s ratio
        "speedup_cpu": {name: statistics.median(r) for name, r in cpu_ratios.items()},  # per CPU-second
        "agreement": {name: agreement(results["course_lib"].tokens, results[name].tokens)
                      for name in engines if name != "course_lib"},
    }
    return out


def run_benchmark(model_kind: str = "tiny", num_prompts: int = 64, max_tokens: int = 64, repeats: int = 3,
                  threads: int | None = 1, seed: int = 0, engines=ENGINES, workloads=("mixed", "uniform"),
                  config: EngineConfig | None = None, attention: str = "auto", forward: str = "auto") -> dict:
    """The whole `bench engine`: both workloads, every engine. Returns one JSON-ready dict.
    `attention` and `forward` are course_lib's EngineConfig fields (when no `config` is given)."""
    from ..model.to_hf import to_hf

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        model, tokenizer, kind = load_model(model_kind, seed)
        hf = to_hf(model) if set(engines) - {"course_lib"} else None
        chosen = [w for w in make_workloads(model, tokenizer, num_prompts, max_tokens, seed) if w.name in workloads]
        import transformers

        config = config or EngineConfig(attention_backend=attention, forward=forward)
        backend = resolve_backend(config.attention_backend, model.device, model.dtype)
        forward = resolve_forward(config.forward, backend, model.dtype)
        load = _load_average()
        results = [bench_workload(model, hf, w, repeats, engines, config) for w in chosen]
        return {
            "model": kind, "model_shape": {k: getattr(model.config, k) for k in
                                           ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads")},
            "num_prompts": num_prompts, "max_tokens": max_tokens, "repeats": repeats,
            "threads": torch.get_num_threads(), "dtype": "float32", "attention_backend": backend,
            "forward": forward,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "load_average_before": load, "load_average_after": _load_average(),
            "workloads": results,
        }
    finally:
        torch.set_num_threads(old_threads)


def format_table(result: dict) -> str:
    lines = [f"model: {result['model']} {result['model_shape']}, {result['num_prompts']} prompts, "
             f"max_tokens {result['max_tokens']}, float32, greedy, {result['threads']} thread(s), "
             f"course_lib attention: {result['attention_backend']}, forward: {result['forward']}, "
             f"median of {result['repeats']}; load average {result['load_average_before']} -> "
             f"{result['load_average_after']}", ""]
    header = (f"{'workload':<9} {'engine':<14} {'tokens':>7} {'median s':>9} {'tok/s':>8} {'course_lib /':>12} "
              f"{'tok/cpu-s':>10} {'(cpu) cl /':>11} {'same answers':>13} {'same tokens':>12} {'setup s':>8}")
    lines += [header, "-" * len(header)]
    for w in result["workloads"]:
        for name, e in w["engines"].items():
            ratio = "" if name == "course_lib" else f"{w['speedup'][name]:.2f}x"
            cpu_ratio = "" if name == "course_lib" else f"{w['speedup_cpu'][name]:.2f}x"
            agree = w["agreement"].get(name)
            same_req = "" if agree is None else f"{agree['requests'] * 100:.1f}%"
            same_tok = "" if agree is None else f"{agree['tokens'] * 100:.1f}%"
            lines.append(f"{w['workload']:<9} {name:<14} {e['output_tokens']:>7} {e['median_s']:>9.3f} "
                         f"{e['tok_s']:>8.0f} {ratio:>12} {e['tok_per_cpu_s']:>10.0f} {cpu_ratio:>11} "
                         f"{same_req:>13} {same_tok:>12} {e['median_setup_s']:>8.3f}")
        lines.append("")
    for w in result["workloads"]:
        lines.append(f"{w['workload']}: {w['description']} ({w['prompt_tokens']} prompt tokens)")
    lines.append("course_lib / X: course_lib's tokens/s over X's, median of the per-repeat ratios (X ran right "
                 "after course_lib);\n(cpu): the same per CPU-second of this process (all threads); "
                 "setup: untimed one-time work (building the engine / manager, HF's warm-up).")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m course_lib bench engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "random"), default="tiny",
                        help="tiny: the shipped model and its task prompts (random weights of the same shape "
                             "if it is not installed); random: random weights, random prompts")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="prompts per run (default 64; 128 with --speculative)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {ENGINES}")
    # every attention backend but the GPU kernel: this benchmark keeps the model on the CPU
    cpu_backends = tuple(b for b in OPTIONS["attention_backend"] if b != "triton")
    parser.add_argument("--attention", default="auto", choices=cpu_backends,
                        help="course_lib's attention backend (auto: the C kernel when it builds, else torch)")
    parser.add_argument("--forward", default="auto", choices=OPTIONS["forward"],
                        help="course_lib's forward pass (auto: the whole step in C where the cpu attention backend "
                             "runs, else the PyTorch model)")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated subset of mixed,uniform (default both); with --speculative: mixed "
                             "and/or task kinds (default mixed,repeat)")
    parser.add_argument("--profile", action="store_true",
                        help="instead: break one course_lib decode step down into phases")
    parser.add_argument("--running", type=int, default=64, help="--profile: running requests")
    parser.add_argument("--steps", type=int, default=40, help="--profile: decode steps measured")
    parser.add_argument("--cprofile", type=int, default=0, help="--profile: also print the top N cProfile rows")
    parser.add_argument("--speculative", action="store_true",
                        help="instead: tokens/s with vs without speculative decoding, at each --concurrency")
    parser.add_argument("--concurrency", default="1,8,64",
                        help="--speculative: comma-separated requests at once (max_num_seqs)")
    parser.add_argument("--drafters", default="ngram,draft",
                        help="--speculative: comma-separated subset of ngram,draft")
    parser.add_argument("--num-speculative-tokens", type=int, default=EngineConfig.num_speculative_tokens,
                        help="--speculative: drafts per decode step (default %(default)s)")
    parser.add_argument("--draft-layers", type=int, default=EngineConfig.draft_layers,
                        help="--speculative: layers of the draft model (the target's first ones; default %(default)s)")
    parser.add_argument("--json", help="write the results as JSON to this path")
    args = parser.parse_args(argv)

    try:
        if args.speculative:
            from . import speculative

            try:
                levels = tuple(int(c) for c in args.concurrency.split(","))
            except ValueError:
                parser.error(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
            result = speculative.run_benchmark(args.model, args.num_prompts or 128, args.max_tokens, args.repeats,
                                               args.threads or None, args.seed, levels,
                                               tuple(args.drafters.split(",")), args.num_speculative_tokens,
                                               args.draft_layers, args.attention, args.forward,
                                               tuple((args.workloads or "mixed,repeat").split(",")))
            print(speculative.format_table(result))
        elif args.profile:
            model = load_model(args.model, args.seed)[0]
            result = profile_engine_step(model, running=args.running, steps=args.steps, threads=args.threads or None,
                                         config=EngineConfig(attention_backend=args.attention, forward=args.forward,
                                                             max_num_seqs=max(64, args.running)),
                                         cprofile_top=args.cprofile)
            print(format_profile(result))
        else:
            result = run_benchmark(args.model, args.num_prompts or 64, args.max_tokens, args.repeats,
                                   args.threads or None, args.seed, tuple(args.engines.split(",")),
                                   tuple((args.workloads or "mixed,uniform").split(",")), attention=args.attention,
                                   forward=args.forward)
            print(format_table(result))
    except ValueError as err:
        parser.error(str(err))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0
