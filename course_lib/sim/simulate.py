"""simulate(): serve a workload with an `LLMEngine` under a clock, and measure it.

The driver loop, in one breath: add every request whose arrival time has come, run one
engine step (the engine charges the step to the clock itself), hand each finished request
back to its closed-loop user (who sends the next one), and when the engine is idle jump the
clock to the next arrival. Every request that is issued ends completed, or failed / aborted
with a reason: none is silently lost.

Two runners:

- `"scripted"`: no model. Prompts are deterministic token ids of the workload's lengths
  (`make_prompt_tokens`); each request stops (EOS) at its scripted output length, unless the
  length cap or `max_model_len` stops it first. Thousands of requests simulate in seconds.
- `"model"`: a real model computes every token. With the shipped tiny model, prompts are
  real task prompts (`course_lib.model.tasks`) and the model decides when to stop (EOS or
  the cap); the workload supplies request ids and arrival times only. A model passed without
  a tokenizer gets the workload's synthetic prompts instead.

Two clocks: `"simulated"` (roofline cost of each step on `gpu` for a model of `model_shape`:
deterministic, a GPU you don't have; the default shape is Llama-3-8B for the scripted runner
and the served model's own shape for the model runner) and `"wall"` (what this machine did;
idle gaps of an open-loop trace are skipped, not slept). Or a ready clock object (anything with
`now` / `charge` / `wait_until`, e.g. a `SimulatedClock` on a fitted spec and step overhead:
`course_lib.loadgen.predict`).

Fitting requests to the engine (documented, counted in `requests_clipped`): a prompt longer
than `max_model_len - 1` is cut to `max_model_len - 1` tokens, an output length is cut to the
room left (`max_model_len - prompt`) and to the per-request cap `max_tokens`. A request that
still cannot be served (e.g. its worst case exceeds the whole KV pool) is recorded as failed
with the engine's error message, and its closed-loop user moves on.
"""
from __future__ import annotations

import dataclasses
import heapq
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

from course_lib.clock import WallClock
from course_lib.engine import LLMEngine, RequestOutput
from course_lib.engine_config import EngineConfig
from course_lib.model.config import ModelConfig
from course_lib.scheduler.sampling import SamplingParams
from course_lib.sim.clock import SimulatedClock
from course_lib.sim.hardware import ModelShape
from course_lib.sim.metrics import summarize
from course_lib.sim.workload import DEFAULT_OUTPUT_DIST, ClosedLoopUsers, RequestSpec, make_prompt_tokens

# The context length simulated when the engine config does not name one. Generous to the
# contiguous baseline (Llama-3-8B serves 8,192): it is the reservation each contiguous request
# makes, and the default workload's longest request (1,024 + 512 tokens) fits inside it.
DEFAULT_SIM_MAX_MODEL_LEN = 2048
# Per-request cap on output tokens (SamplingParams.max_tokens): the default workload's longest
# output. The scripted request usually stops earlier, at its own length; the cap is what a
# worst-case (reserve) admission policy has to plan for, since a server cannot know the length.
DEFAULT_MAX_TOKENS = DEFAULT_OUTPUT_DIST.hi
# A run that computes nothing for this many steps in a row, with requests still unfinished,
# is stuck (e.g. an admission policy that never admits): raise instead of spinning forever.
STALL_STEPS = 10_000

RUNNERS = ("scripted", "model")
CLOCKS = ("simulated", "wall")


class SimulationStalled(RuntimeError):
    """The engine made no progress for STALL_STEPS steps while requests were unfinished."""


@dataclass
class SimResult:
    summary: dict  # sim.metrics.summarize + a few counts (JSON-safe)
    requests: list  # one RequestOutput per issued request (finished, failed or aborted)
    steps: list  # the engine's StepStats, one per step
    config: dict  # how the run was set up (JSON-safe)
    specs: list = field(default_factory=list)  # the RequestSpecs as served (after clipping), issue order
    engine: object = None  # the LLMEngine, for inspection (not serialised)
    prompt_texts: dict = field(default_factory=dict)  # model runner with a tokenizer: request id -> prompt text

    def to_json(self, include_requests: bool = False) -> dict:
        """The summary's keys at the top level (the `simulate --json` contract), plus `config`."""
        out = dict(self.summary)
        out["config"] = self.config
        if include_requests:
            out["requests"] = [_request_json(r) for r in self.requests]
        return out


def _request_json(r: RequestOutput) -> dict:
    return {
        "request_id": r.request_id, "num_prompt_tokens": len(r.prompt_token_ids),
        "num_output_tokens": len(r.token_ids), "finish_reason": r.finish_reason, "error": r.error,
        "arrival_time": r.arrival_time, "first_scheduled_time": r.first_scheduled_time,
        "first_token_time": r.first_token_time, "finish_time": r.finish_time,
        "num_preemptions": r.num_preemptions, "num_cached_tokens": r.num_cached_tokens,
    }


# ---------------------------------------------------------------------------------------------
# Building the pieces
# ---------------------------------------------------------------------------------------------


def scripted_model_config(max_model_len: int) -> ModelConfig:
    """What the scripted runner needs of a model: a vocabulary and an EOS id (and a context
    length). The tiny model's, when its files are there; the same character vocabulary otherwise."""
    from course_lib.model.tiny import TINY_DIR
    from course_lib.model.tokenizer import CharTokenizer

    path = TINY_DIR / "config.json"
    if path.is_file():
        cfg = ModelConfig.load(path)
    else:
        tok = CharTokenizer()
        cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=192, num_layers=2,
                          num_heads=4, num_kv_heads=2, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return dataclasses.replace(cfg, max_position_embeddings=max_model_len)


def make_engine_config(
    *,
    kv_tokens: int = 20480,
    page_size: int = 16,
    scheduler: str = "continuous",
    kv: str = "paged",
    admission: str = "watermark",
    prefix_caching: bool = False,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    max_model_len: int | None = None,
    **overrides,
) -> EngineConfig:
    """An EngineConfig sized by KV memory: a pool of `kv_tokens` slots (`kv_tokens // page_size`
    pages; the contiguous layout carves the same slots into max_model_len reservations).
    Defaults are the simulation's: 256 batch seats and a 2,048-token step budget (vLLM-like),
    so that the KV pool, not the seat count, is what limits a run."""
    if kv_tokens < page_size:
        raise ValueError(f"a KV pool of {kv_tokens} tokens holds no page of {page_size} tokens")
    return EngineConfig(page_size=page_size, num_pages=kv_tokens // page_size, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, scheduler=scheduler, kv_layout=kv,
                        admission=admission, enable_prefix_caching=prefix_caching, max_model_len=max_model_len,
                        **overrides)


def make_clock(clock: str, gpu: str = "H100", model_shape: str = "llama-3-8b"):
    if not isinstance(clock, str):
        return clock  # a ready clock (now / charge / wait_until), e.g. SimulatedClock(..., overhead_s=...)
    if clock == "simulated":
        return SimulatedClock(gpu, model_shape)
    if clock == "wall":
        return WallClock(skip_idle=True)
    raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")


def task_prompt(request_id: str, seed: int) -> tuple[str, str]:
    """A real tiny-model task (prompt text, expected answer), the same for the same (seed, request id)."""
    from course_lib.model.tasks import sample_task

    return sample_task(random.Random(f"{seed}-{request_id}"))


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def simulate(
    engine_config: EngineConfig,
    workload: ClosedLoopUsers | Sequence[RequestSpec],
    *,
    runner: str = "scripted",
    clock="simulated",  # "simulated", "wall", or a ready clock object
    gpu: str = "H100",
    model_shape=None,
    model=None,
    tokenizer=None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    progress: bool = True,
    max_steps: int | None = None,
    label: str | None = None,
) -> SimResult:
    """Serve `workload` (closed-loop users, or a list of RequestSpecs with arrival times) and
    return its metrics. See the module docstring for the runners, clocks and clipping rules.

    `model`/`tokenizer`: the model runner's model (default: the shipped tiny model and its
    tokenizer). `max_tokens`: the per-request cap on output tokens. `max_steps`: stop after
    this many engine steps (unfinished requests are then aborted, still recorded).
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if isinstance(clock, str) and clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    wall_start = time.perf_counter()
    if runner == "model" and model is None:
        from course_lib.model.tiny import load_tiny

        model, tokenizer = load_tiny()
    if model_shape is None:  # what the simulated clock prices: the model being served, else Llama-3-8B
        model_shape = ModelShape.from_config(model.config, name="served model") if runner == "model" else "llama-3-8b"
    the_clock = make_clock(clock, gpu, model_shape)

    if runner == "model":
        model_max = model.config.max_position_embeddings
        if engine_config.max_model_len is not None and engine_config.max_model_len > model_max:
            raise ValueError(f"max_model_len {engine_config.max_model_len} exceeds the model's context "
                             f"(max_position_embeddings={model_max})")
        engine = LLMEngine(model, engine_config, clock=the_clock)
    else:
        max_len = engine_config.max_model_len or DEFAULT_SIM_MAX_MODEL_LEN
        engine_config = dataclasses.replace(engine_config, max_model_len=max_len)
        engine = LLMEngine(scripted_model_config(max_len), engine_config, clock=the_clock)
    max_model_len = engine.max_model_len
    vocab_size = engine.model_config.vocab_size
    reserved = sorted({0, 1, 2, *engine.model_config.eos_token_ids})

    closed = isinstance(workload, ClosedLoopUsers)
    if closed:
        initial, total = workload.initial(), workload.num_requests
    else:
        initial, total = list(workload), len(workload)

    # Future arrivals: (time, issue order, spec). A spec with arrival_time None arrives at t=0.
    arrivals: list[tuple[float, int, RequestSpec]] = []
    order = 0

    def push(spec: RequestSpec) -> None:
        nonlocal order
        heapq.heappush(arrivals, (spec.arrival_time or 0.0, order, spec))
        order += 1

    for spec in initial:
        push(spec)

    served: dict[str, RequestSpec] = {}  # request id -> spec as served
    specs_in_order: list[RequestSpec] = []
    outputs: dict[str, RequestOutput] = {}  # finished requests, by id
    prompt_texts: dict[str, str] = {}
    clipped = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=label or "simulate", unit="req", mininterval=0.5, leave=False)

    def finished(out: RequestOutput, spec: RequestSpec) -> None:
        outputs[out.request_id] = out
        if bar is not None:
            bar.update(1)
        if closed:
            nxt = workload.on_finish(spec, out.finish_time)
            if nxt is not None:
                push(nxt)

    def admit(spec: RequestSpec, t: float) -> None:
        nonlocal clipped
        if runner == "model" and tokenizer is not None:
            text, _ = task_prompt(spec.request_id, seed)
            prompt = tokenizer.encode_prompt(text)
            prompt_texts[spec.request_id] = text
            served_spec = dataclasses.replace(spec, prompt_len=len(prompt), output_len=0, shared_prefix_len=0)
            cap = max(1, min(max_tokens, max_model_len - len(prompt)))
            scripted_len = None
        else:
            prompt_len = min(spec.prompt_len, max_model_len - 1)
            cap = max(1, min(max_tokens, max_model_len - prompt_len))
            # The scripted runner stops at the (clipped) workload length; a model decides for itself (0 here).
            output_len = max(1, min(spec.output_len, cap)) if runner == "scripted" else 0
            if prompt_len != spec.prompt_len or (runner == "scripted" and output_len != spec.output_len):
                clipped += 1
            served_spec = dataclasses.replace(spec, prompt_len=prompt_len, output_len=output_len,
                                              shared_prefix_len=min(spec.shared_prefix_len, prompt_len))
            prompt = make_prompt_tokens(served_spec, vocab_size, seed=seed, reserved_ids=reserved)
            scripted_len = output_len or None
        served[spec.request_id] = served_spec
        specs_in_order.append(served_spec)
        try:
            engine.add_request(prompt, SamplingParams(max_tokens=cap, ignore_eos=False), request_id=spec.request_id,
                               arrival_time=t, scripted_output_len=scripted_len)
        except ValueError as err:  # cannot be served at all: record it as failed, with the reason
            finished(RequestOutput(spec.request_id, prompt, [], True, "error", str(err), arrival_time=t,
                                   finish_time=max(t, the_clock.now())), served_spec)

    idle_steps = 0
    while True:
        now = the_clock.now()
        while arrivals and arrivals[0][0] <= now:
            t, _, spec = heapq.heappop(arrivals)
            admit(spec, t)
        if not engine.has_unfinished_requests:
            if not arrivals:
                break
            the_clock.wait_until(arrivals[0][0])
            continue
        if max_steps is not None and len(engine.step_stats) >= max_steps:
            break
        for out in engine.step():
            if out.finished and out.request_id not in outputs:
                finished(out, served[out.request_id])
        last = engine.step_stats[-1]
        idle_steps = idle_steps + 1 if last.num_prefill_tokens + last.num_decode_tokens == 0 else 0
        if idle_steps >= STALL_STEPS:
            if bar is not None:
                bar.close()
            s = engine.stats()
            raise SimulationStalled(
                f"no token computed for {STALL_STEPS} steps with {s['num_waiting']} requests waiting and "
                f"{s['num_running']} running ({s['pages_free']} of {s['num_pages']} KV pages free, admission "
                f"{engine_config.admission!r}): the waiting request can never be admitted")

    # Stopped early (max_steps): abort what is left, so every issued request has an ending.
    for rid in list(served):
        if rid not in outputs and rid in engine.requests:
            engine.abort(rid)
            finished(RequestOutput.of(engine.requests[rid]), served[rid])
    if bar is not None:
        bar.close()

    records = [outputs[s.request_id] for s in specs_in_order]
    stats = engine.stats()
    # Speculative decoding: the scheduler counts the drafted rows (a request's last token and its drafts
    # checked in one step); 1 + kept drafts per drafted row is vLLM's mean acceptance length.
    summary = summarize(records, engine.step_stats, prefix_queried=stats["prefix_queried_tokens"],
                        prefix_hits=stats["prefix_hit_tokens"], num_drafts=engine.scheduler.num_drafts)
    summary.update(
        requests_total=len(records),
        requests_not_issued=total - len(records),
        requests_clipped=clipped,
        sim_time_s=float(the_clock.now()),
        wall_time_s=time.perf_counter() - wall_start,
        # the simulated GPU time a draft model's own passes took (None on the wall clock, which cannot tell)
        spec_draft_model_time_s=float(the_clock.draft_s) if hasattr(the_clock, "draft_s") else None,
    )
    config = {
        "label": label,
        "runner": runner,
        "clock": clock if isinstance(clock, str) else type(clock).__name__,
        "gpu": gpu if clock == "simulated" else getattr(getattr(the_clock, "gpu", None), "name", None),
        "model_shape": getattr(model_shape, "name", model_shape) if clock == "simulated" else None,
        "workload": _describe_workload(workload),
        "max_tokens": max_tokens,
        "seed": seed,
        "max_model_len": max_model_len,
        "kv_pool_tokens": engine.pool.num_pages * engine.pool.page_size,
        "engine": dataclasses.asdict(engine_config),
    }
    return SimResult(summary, records, engine.step_stats, config, specs_in_order, engine, prompt_texts)


def _describe_workload(workload) -> dict:
    if isinstance(workload, ClosedLoopUsers):
        return {"kind": "closed_loop", "users": workload.num_users, "requests": workload.num_requests,
                "think_time_s": workload.think_time, "shared_prefix": workload.shared_prefix}
    specs = list(workload)
    return {"kind": "open_loop", "requests": len(specs),
            "shared_prefix": max((s.shared_prefix_len for s in specs), default=0)}
