"""`python -m course_lib simulate`: serve a synthetic workload, print a table, write JSON.

    python -m course_lib simulate --users 100 --requests 400 --scheduler continuous --kv paged \\
        --page-size 16 --kv-tokens 20480 --admission watermark --json run.json

Load is either `--users N` (closed loop: N users, each waits for its answer, thinks
`--think-time` seconds on average, asks again) or `--rate R` (open loop: Poisson arrivals at R
requests/s, `--burstiness` < 1 for clumpier traffic), or `--trace PATH` (replay a saved trace).
Prompt and output lengths are chat-like log-normals (`course_lib.sim.workload`); `--shared-prefix
T` starts every prompt with the same T tokens (a system prompt), which `--prefix-caching` reuses.

The KV memory is `--kv-tokens` slots: `--kv-tokens // --page-size` pages when paged; the
contiguous layout reserves `--max-model-len` slots per running request out of the same memory.
With the simulated clock, time is the roofline cost of each step on `--gpu` for a model of
`--model-shape`; with `--clock wall` it is what this machine did.

`--speculative K` drafts K tokens per decode step (n-gram prompt lookup, or `--drafter draft`
with the model runner) and checks them in the same forward pass: the table then shows the run
without speculation beside it, on the same workload, with the draft acceptance rate and the
tokens each request gains per step. The scripted runner has no model to agree with the drafts:
it keeps each one with probability `--acceptance-rate` (default 0.7), given it kept the ones
before, so k drafts yield 1 + a + ... + a^k tokens per drafted step (2.53 for k = 3, a = 0.7)
and an acceptance rate (kept / drafted) of (a + ... + a^k) / k (51% there). The simulated clock
charges a drafted step its 1 + k tokens per request, and a draft model's own k passes (as one with
a KV cache of its own would run them: one row per request each, through `--draft-layers` of the
target's layers); n-gram lookup drafts for free. `course_lib.sim.speculative` has the steady-state
roofline of it: where speculation stops paying as the batch grows.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
from pathlib import Path

SCRIPTED_DEFAULTS = {"users": 100, "requests": 400}
MODEL_DEFAULTS = {"users": 8, "requests": 16}  # the real model computes every token on the CPU


def build_parser() -> argparse.ArgumentParser:
    from course_lib.engine_config import OPTIONS, EngineConfig  # the one list of each knob's names (torch-free)
    from course_lib.sim.speculative import DEFAULT_ACCEPTANCE_RATE

    p = argparse.ArgumentParser(
        prog="python -m course_lib simulate",
        description="Serve a synthetic workload with the course engine and report latency, throughput and KV waste.",
        epilog="Defaults: 100 closed-loop users and 400 requests (8 users, 16 requests with --runner model), "
               "continuous batching, paged KV (page 16) in a 20,480-token pool, watermark admission, "
               "scripted runner, simulated H100 serving llama-3-8b.",
    )
    load = p.add_argument_group("load (one of)").add_mutually_exclusive_group()
    load.add_argument("--users", type=int, help="closed loop: N users, each with one request outstanding")
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests per second")
    load.add_argument("--trace", metavar="PATH", help="open loop: replay the requests of a saved trace (JSON lines)")
    w = p.add_argument_group("workload")
    w.add_argument("--requests", type=int, help="requests to serve in total")
    w.add_argument("--shared-prefix", type=int, default=0, metavar="T",
                   help="every prompt starts with the same T tokens (a shared system prompt)")
    w.add_argument("--think-time", type=float, default=None, metavar="S",
                   help="closed loop: mean think time between a user's requests, seconds (default 0)")
    w.add_argument("--burstiness", type=float, default=None,
                   help="open loop: gamma shape of the gaps (1 = Poisson, < 1 burstier; default 1)")
    w.add_argument("--max-tokens", type=int, default=None,
                   help="per-request cap on output tokens (SamplingParams.max_tokens; default 512)")
    w.add_argument("--seed", type=int, default=0, help="workload and sampling seed")
    w.add_argument("--save-trace", metavar="PATH", help="write the requests served (after clipping) as a trace")
    e = p.add_argument_group("engine")
    e.add_argument("--scheduler", choices=OPTIONS["scheduler"], default="continuous")
    e.add_argument("--kv", choices=OPTIONS["kv_layout"], default="paged")
    e.add_argument("--page-size", type=int, default=16, metavar="P")
    e.add_argument("--kv-tokens", type=int, default=20480, metavar="T", help="KV pool capacity in tokens")
    e.add_argument("--admission", choices=OPTIONS["admission"], default="watermark")
    e.add_argument("--watermark", type=float, default=0.05, help="free fraction the watermark policy keeps")
    e.add_argument("--preemption", choices=OPTIONS["preemption"], default="recompute",
                   help="what happens to a request that cannot grow: recompute later, or fail")
    e.add_argument("--prefix-caching", action="store_true", help="reuse cached KV pages of shared prefixes")
    e.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    e.add_argument("--max-num-seqs", type=int, default=256, help="batch seats (default 256)")
    e.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step (default 2048)")
    e.add_argument("--max-model-len", type=int, default=None,
                   help="context length; contiguous KV reserves this much per request "
                        "(default 2048 scripted, the model's with --runner model)")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative", type=int, default=0, metavar="K",
                   help="draft K tokens per decode step and check them in one pass (0: off, the default); "
                        "the run without speculation is shown beside it")
    s.add_argument("--acceptance-rate", type=float, default=None, metavar="A",
                   help="scripted runner: the chance the target keeps each draft, given it kept the ones before "
                        f"(default {DEFAULT_ACCEPTANCE_RATE}); the model runner's own predictions decide instead")
    s.add_argument("--drafter", choices=[d for d in OPTIONS["speculative"] if d != "none"], default="ngram",
                   help="who drafts: ngram (prompt lookup, no model; the default) or draft (the model's first "
                        "layers, --runner model only)")
    s.add_argument("--draft-layers", type=int, default=None, metavar="L",
                   help=f"--drafter draft: how many of the model's first layers draft (default "
                        f"{EngineConfig.draft_layers}); the simulated clock prices their passes at that share")
    r = p.add_argument_group("runner and clock")
    r.add_argument("--runner", choices=("scripted", "model"), default="scripted",
                   help="scripted: no model, lengths from the workload; model: the tiny model computes every token")
    r.add_argument("--clock", choices=("simulated", "wall"), default="simulated",
                   help="simulated: roofline time on --gpu; wall: this machine's time")
    r.add_argument("--threads", type=int, default=1,
                   help="--runner model: torch CPU threads (default 1: a tiny model gains nothing from more, "
                        "and spinning threads on a shared CPU cost up to ~20x)")
    r.add_argument("--gpu", default=None, help="simulated clock: H100 (default), H200, A100, L4, T4")
    r.add_argument("--model-shape", default=None,
                   help="simulated clock: llama-3-8b (default), llama-3-70b, qwen2-0.5b, tiny "
                        "(default with --runner model: the served model's own shape)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write the summary (and config) as one JSON object")
    o.add_argument("--plots", metavar="DIR", help="save the run's plots (PNG) into DIR")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _positive(parser, name, value, minimum=1):
    if value is not None and value < minimum:
        parser.error(f"{name} must be >= {minimum}, got {value}")


def check_args(parser: argparse.ArgumentParser, args) -> None:
    """Flag combinations that cannot mean anything: fail before running, naming the limit."""
    _positive(parser, "--users", args.users)
    _positive(parser, "--requests", args.requests)
    _positive(parser, "--page-size", args.page_size)
    _positive(parser, "--kv-tokens", args.kv_tokens)
    _positive(parser, "--max-tokens", args.max_tokens)
    _positive(parser, "--max-num-seqs", args.max_num_seqs)
    _positive(parser, "--max-num-batched-tokens", args.max_num_batched_tokens)
    _positive(parser, "--max-model-len", args.max_model_len, 2)
    _positive(parser, "--shared-prefix", args.shared_prefix, 0)
    _positive(parser, "--threads", args.threads)
    if args.rate is not None and not args.rate > 0:
        parser.error(f"--rate must be > 0 requests/s, got {args.rate}")
    if args.think_time is not None and args.think_time < 0:
        parser.error(f"--think-time must be >= 0 s, got {args.think_time}")
    if args.burstiness is not None and not args.burstiness > 0:
        parser.error(f"--burstiness must be > 0, got {args.burstiness}")
    if args.think_time is not None and args.users is None and (args.rate is not None or args.trace):
        parser.error("--think-time applies to closed-loop --users only")
    if args.burstiness is not None and args.rate is None:
        parser.error("--burstiness applies to open-loop --rate only")
    if args.trace and args.shared_prefix:
        parser.error("--shared-prefix cannot be combined with --trace: the trace fixes every prompt")
    if args.kv_tokens < args.page_size:
        parser.error(f"--kv-tokens {args.kv_tokens} is smaller than one page (--page-size {args.page_size})")
    if args.prefix_caching and args.kv == "contiguous":
        parser.error("--prefix-caching needs --kv paged: the contiguous layout has no pages to share")
    if args.clock == "wall" and (args.gpu is not None or args.model_shape is not None):
        parser.error("--gpu and --model-shape describe the simulated clock; drop them with --clock wall")
    if args.runner == "model" and args.shared_prefix:
        parser.error("--shared-prefix needs --runner scripted: the tiny model's task prompts share no prefix")
    if not 0.0 <= args.watermark < 1.0:
        parser.error(f"--watermark must be a fraction in [0, 1), got {args.watermark}")
    _positive(parser, "--speculative", args.speculative, 0)
    if args.speculative == 0 and (args.acceptance_rate is not None or args.drafter != "ngram"):
        parser.error("--acceptance-rate and --drafter apply to --speculative K > 0 only")
    if args.acceptance_rate is not None and not 0.0 <= args.acceptance_rate <= 1.0:
        parser.error(f"--acceptance-rate must be a probability in [0, 1], got {args.acceptance_rate}")
    if args.acceptance_rate is not None and args.runner == "model":
        parser.error("--acceptance-rate drives the scripted runner; with --runner model the model decides")
    if args.drafter == "draft" and args.runner != "model":
        parser.error("--drafter draft drafts with the model's first layers: it needs --runner model")
    if args.draft_layers is not None and args.drafter != "draft":
        parser.error("--draft-layers applies to --drafter draft only")
    if args.speculative and args.scheduler != "continuous":
        parser.error("--speculative needs --scheduler continuous (only it schedules drafted decodes)")


def _load_model():
    """The model runner's (model, tokenizer): the shipped tiny model. Tests may replace this."""
    from course_lib.model.tiny import load_tiny

    return load_tiny()


def check_pool(parser, args, max_model_len: int, longest_prompt: int, max_tokens: int) -> None:
    """The pool must hold the largest request this workload can ever send, or that request
    could never finish (the engine would reject it)."""
    prompt = min(longest_prompt, max_model_len - 1)
    worst = min(prompt + max_tokens, max_model_len) - 1  # the final token's K/V is never computed
    if args.kv == "contiguous":
        need, why = max_model_len, f"the contiguous layout reserves --max-model-len {max_model_len} per request"
    else:
        need = math.ceil(worst / args.page_size) * args.page_size
        why = (f"the longest request is {worst} KV slots (prompt up to {prompt} + --max-tokens {max_tokens}, "
               f"within max_model_len {max_model_len}, minus the last token) = "
               f"{need // args.page_size} pages of {args.page_size}")
    have = args.kv_tokens // args.page_size * args.page_size
    if have < need:
        parser.error(f"--kv-tokens {args.kv_tokens} is smaller than one request can ever need: {why}; "
                     f"use --kv-tokens >= {need}")
    if args.admission == "watermark":
        # The watermark policy admits only if `watermark` of the pool stays free after the first
        # chunk, even into an empty engine: a pool too small for that never admits anyone.
        if args.kv == "contiguous":
            pages, page_tokens, first = have // max_model_len, max_model_len, 1
        else:
            chunk = prompt if args.no_chunked_prefill else min(prompt, args.max_num_batched_tokens)
            pages, page_tokens, first = have // args.page_size, args.page_size, math.ceil(chunk / args.page_size)
        if pages - first < args.watermark * pages:
            enough = math.ceil(first / (1 - args.watermark)) * page_tokens
            parser.error(f"--admission watermark keeps {args.watermark:.0%} of the pool free, so a pool of {pages} "
                         f"page(s) of {page_tokens} tokens can never admit a request needing {first} page(s) at "
                         f"once; use --kv-tokens >= {enough} or --admission none/reserve")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    from course_lib.sim.simulate import DEFAULT_MAX_TOKENS, DEFAULT_SIM_MAX_MODEL_LEN, make_engine_config, simulate
    from course_lib.sim.workload import DEFAULT_PROMPT_DIST, ClosedLoopUsers, load_trace, open_loop, save_trace

    defaults = MODEL_DEFAULTS if args.runner == "model" else SCRIPTED_DEFAULTS
    requests = args.requests or defaults["requests"]
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS

    model = tokenizer = None
    if args.runner == "model":
        import torch

        torch.set_num_threads(args.threads)
        try:
            model, tokenizer = _load_model()
        except (FileNotFoundError, ValueError) as err:
            parser.error(f"--runner model needs the tiny model: {err}")
        model_max = model.config.max_position_embeddings
        if args.max_model_len is not None and args.max_model_len > model_max:
            parser.error(f"--max-model-len {args.max_model_len} exceeds the model's context of {model_max} tokens")
        max_model_len = args.max_model_len or model_max
    else:
        max_model_len = args.max_model_len or DEFAULT_SIM_MAX_MODEL_LEN
    if args.shared_prefix > max_model_len - 2:
        parser.error(f"--shared-prefix {args.shared_prefix} leaves no room in max_model_len {max_model_len}")

    # The workload.
    if args.trace:
        try:
            workload = load_trace(args.trace)
        except (OSError, ValueError) as err:
            parser.error(f"--trace: {err}")
        if args.requests:
            workload = workload[: args.requests]
        if not workload:
            parser.error(f"--trace {args.trace} holds no request")
        longest = max(s.prompt_len for s in workload)
    elif args.rate is not None:
        workload = open_loop(requests, args.rate, seed=args.seed, burstiness=args.burstiness or 1.0,
                             shared_prefix=args.shared_prefix)
        longest = DEFAULT_PROMPT_DIST.hi + args.shared_prefix
    else:
        workload = ClosedLoopUsers(args.users or defaults["users"], requests, seed=args.seed,
                                   think_time=args.think_time or 0.0, shared_prefix=args.shared_prefix)
        longest = DEFAULT_PROMPT_DIST.hi + args.shared_prefix
    if args.runner == "model" and tokenizer is not None:
        longest = max_model_len - 1  # task prompts are short; bound by the context instead
    check_pool(parser, args, max_model_len, longest, max_tokens)

    from course_lib.sim.speculative import DEFAULT_ACCEPTANCE_RATE

    speculation = {}
    if args.speculative:
        speculation = dict(speculative=args.drafter, num_speculative_tokens=args.speculative,
                           spec_acceptance_rate=DEFAULT_ACCEPTANCE_RATE if args.acceptance_rate is None
                           else args.acceptance_rate)
        if args.draft_layers is not None:
            speculation["draft_layers"] = args.draft_layers
    try:
        config = make_engine_config(
            kv_tokens=args.kv_tokens, page_size=args.page_size, scheduler=args.scheduler, kv=args.kv,
            admission=args.admission, prefix_caching=args.prefix_caching, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_model_len,
            watermark=args.watermark, preemption=args.preemption,
            enable_chunked_prefill=not args.no_chunked_prefill, seed=args.seed,
            record_page_owners=bool(args.plots) and requests <= 2000, **speculation,
        )

        def run(engine_config, label):
            # A closed-loop workload is consumed by a run: each run gets its own copy.
            return simulate(engine_config, copy.deepcopy(workload), runner=args.runner, clock=args.clock,
                            gpu=args.gpu or "H100", model_shape=args.model_shape, model=model, tokenizer=tokenizer,
                            max_tokens=max_tokens, seed=args.seed, progress=not args.no_progress, label=label)

        baseline = run(dataclasses.replace(config, speculative="none"), f"{args.scheduler}+{args.kv}") \
            if args.speculative else None
        result = run(config, f"{args.scheduler}+{args.kv}" + (f"+spec{args.speculative}" if args.speculative else ""))
    except ValueError as err:
        parser.error(str(err))
    except RuntimeError as err:  # e.g. SimulationStalled: the setup can never finish its requests
        print(f"simulate: {err}", file=sys.stderr)
        return 1

    name = f"{args.scheduler} + {args.kv}"
    print(describe(result))
    from course_lib.sim.metrics import format_table

    if baseline is None:
        print(format_table({name: result.summary}))
    else:
        spec_name = f"{name} + {args.drafter} k={args.speculative}"
        print(format_table({name: baseline.summary, spec_name: result.summary}))
        print(describe_speculation(result, baseline))
    if result.summary["requests_clipped"]:
        print(f"note: {result.summary['requests_clipped']} request(s) clipped to max_model_len {max_model_len} "
              f"/ --max-tokens {max_tokens}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        data = result.to_json()
        if baseline is not None:  # the same workload without speculation, for the comparison
            data["without_speculation"] = baseline.summary
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.save_trace:
        save_trace(result.specs, args.save_trace)
        print(f"wrote {args.save_trace}")
    if args.plots:
        for path in save_plots(result, args.plots, name):
            print(f"wrote {path}")
    return 0


def describe(result) -> str:
    c, w = result.config, result.config["workload"]
    load = (f"{w['users']} closed-loop users, {w['requests']} requests" if w["kind"] == "closed_loop"
            else f"open loop, {w['requests']} requests")
    clock = f"simulated {c['gpu']} serving {c['model_shape']}" if c["clock"] == "simulated" else "wall clock"
    e = c["engine"]
    kv = (f"paged KV, page {e['page_size']}" if e["kv_layout"] == "paged"
          else f"contiguous KV, {c['max_model_len']} slots per request")
    return (f"{load} | {e['scheduler']} batching, {kv}, pool {c['kv_pool_tokens']} tokens | admission "
            f"{e['admission']} | {c['runner']} runner, {clock} | {result.summary['wall_time_s']:.1f} s to run")


def describe_speculation(result, baseline) -> str:
    """One paragraph: how often the drafts were kept, what a step gave each request, and what that
    did to TPOT and throughput against the run without speculation."""
    s, b, e = result.summary, baseline.summary, result.config["engine"]
    if not s["spec_draft_tokens"]:
        return "speculation: no decode step was drafted (no n-gram ever matched, or no request reached decode)"
    scripted = (f", each kept with probability {e['spec_acceptance_rate']:g} by the scripted target"
                if result.config["runner"] == "scripted" else "")
    lines = [f"speculation: {e['num_speculative_tokens']} {e['speculative']} draft(s) per decode step{scripted}; "
             f"{s['spec_accepted_tokens']} of {s['spec_draft_tokens']} drafts kept "
             f"({s['spec_acceptance_rate']:.1%}), {s['tokens_per_drafted_step']:.2f} tokens per drafted step "
             f"({s['spec_num_drafts']} drafted request-steps), {s['tokens_per_decode_step']:.2f} per decode step"]
    if s.get("spec_draft_model_time_s") and s["sim_time_s"]:
        lines.append(f"the draft model's own passes took {s['spec_draft_model_time_s']:.3g} s of the "
                     f"{s['sim_time_s']:.3g} s simulated ({s['spec_draft_model_time_s'] / s['sim_time_s']:.1%})")
    ratios = [f"TPOT {q} x{s['tpot_s'][q] / b['tpot_s'][q]:.2f}" for q in ("p50", "p99")
              if s["tpot_s"][q] and b["tpot_s"][q]]
    if b["throughput_tok_s"]:
        ratios.append(f"throughput x{s['throughput_tok_s'] / b['throughput_tok_s']:.2f}")
    if ratios:
        lines.append("with / without speculation: " + ", ".join(ratios))
    return "\n".join(lines)


def save_plots(result, out_dir, name: str = "run") -> list[Path]:
    """The run's plots as PNGs in `out_dir`: timeline, KV over time, queues, latency CDFs, page map."""
    import matplotlib

    matplotlib.use("Agg")
    from course_lib.viz import kv_utilisation, latency_cdfs, page_pool_map, queue_lengths, timeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "timeline.png": timeline(result.requests, title=f"{name}: first 40 requests", max_rows=40),
        "kv_utilisation.png": kv_utilisation(result.steps),
        "queue_lengths.png": queue_lengths(result.steps),
        "latency_cdfs.png": latency_cdfs({name: result.requests}),
    }
    if any(s.page_owners is not None for s in result.steps):
        figures["page_pool_map.png"] = page_pool_map(result.steps, title=f"{name}: page pool")
    paths = []
    for filename, fig in figures.items():
        fig.savefig(out / filename, dpi=100)
        paths.append(out / filename)
    return paths


if __name__ == "__main__":
    sys.exit(main())
