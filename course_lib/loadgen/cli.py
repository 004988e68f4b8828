"""`python -m course_lib load`: drive any OpenAI-compatible endpoint with the simulator's workloads.

    python -m course_lib load --url http://127.0.0.1:8000 --users 100 --requests 400 --json load.json
    python -m course_lib load --url http://gpu-node:8000 --rate 20 --burstiness 0.5 --requests 1000 \\
        --slo ttft_ms=500,tpot_ms=50 --json vllm.json          # a vLLM or SGLang server on a cluster

The JSON has the keys of `simulate --json` (TTFT, TPOT, latency percentiles, throughput, ...) plus
ITL and goodput under the SLO, and the same numbers under `vllm bench serve`'s keys (`mean_ttft_ms`,
`p99_tpot_ms`, `mean_itl_ms`, ...): run the same experiment on the simulator, our server and a real
deployment, and compare the files (docs/metrics.md defines TPOT and ITL).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

WORKLOADS = ("chat", "shared-prefix")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY, if set)")
    load = p.add_argument_group("load (one of)").add_mutually_exclusive_group(required=True)
    load.add_argument("--users", type=int, help="closed loop: N users, each with one request outstanding")
    load.add_argument("--rate", type=float, help="open loop: requests per second (Poisson, or gamma gaps)")
    w = p.add_argument_group("workload")
    w.add_argument("--requests", type=int, default=100, help="requests in total")
    w.add_argument("--workload", default="chat",
                   help="chat (log-normal lengths), shared-prefix (chat + one system prompt), or a trace FILE "
                        "(JSON lines, as simulate --save-trace writes)")
    w.add_argument("--shared-prefix", type=int, default=None, metavar="T",
                   help="shared-prefix workload: tokens every prompt starts with (default 64)")
    w.add_argument("--burstiness", type=float, default=1.0, help="open loop: gamma shape (1 = Poisson, < 1 burstier)")
    w.add_argument("--think-time", type=float, default=0.0, help="closed loop: mean think time, seconds")
    w.add_argument("--prompt-len", default=None, metavar="LO:HI", help="uniform prompt lengths instead of chat's")
    w.add_argument("--output-len", default=None, metavar="LO:HI", help="uniform answer lengths instead of chat's")
    w.add_argument("--max-tokens", type=int, default=512, help="cap on any answer's length")
    w.add_argument("--max-model-len", type=int, default=None,
                   help="the server's context (default: /v1/models' max_model_len, else 2048)")
    w.add_argument("--vocab-size", type=int, default=None, help="prompt token ids are drawn below this (default 47: "
                                                                "the tiny model's, valid for any vocabulary)")
    w.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("output")
    o.add_argument("--slo", default=None, help="goodput targets, e.g. ttft_ms=500,tpot_ms=50 (also latency_ms)")
    o.add_argument("--json", metavar="PATH", help="write the summary as one JSON object")
    o.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    o.add_argument("--no-progress", action="store_true")
    return p


def _length_range(parser, flag: str, text: str | None):
    from course_lib.sim.workload import LengthDist

    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        lo, hi = int(lo), int(hi if sep else lo)
        return LengthDist.uniform(lo, hi)
    except ValueError as err:
        parser.error(f"{flag} takes LO:HI with 1 <= LO <= HI (integers), got {text!r} ({err})")


def discover(url: str, api_key: str | None) -> dict:
    """The first model of /v1/models (name, max_model_len if the server says): {} if it does not answer."""
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=10.0)
        data = r.json().get("data") or []
        return data[0] if data else {}
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}


def build_workload(parser, args):
    from course_lib.sim.workload import DEFAULT_OUTPUT_DIST, DEFAULT_PROMPT_DIST, ClosedLoopUsers, load_trace, \
        open_loop

    prompt_dist = _length_range(parser, "--prompt-len", args.prompt_len) or DEFAULT_PROMPT_DIST
    output_dist = _length_range(parser, "--output-len", args.output_len) or DEFAULT_OUTPUT_DIST
    if args.workload not in WORKLOADS:
        if args.shared_prefix is not None:
            parser.error("--shared-prefix applies to the shared-prefix workload, not a trace")
        path = Path(args.workload)
        if not path.is_file():
            parser.error(f"--workload must be chat, shared-prefix or a trace file; {args.workload!r} is none")
        try:
            specs = load_trace(path)[: args.requests]
        except (OSError, ValueError) as err:
            parser.error(f"--workload {path}: {err}")
        if not specs:
            parser.error(f"--workload {path} holds no request")
        return specs
    shared = (64 if args.shared_prefix is None else args.shared_prefix) if args.workload == "shared-prefix" else 0
    if args.workload == "chat" and args.shared_prefix:
        parser.error("--shared-prefix needs --workload shared-prefix")
    if args.users is not None:
        return ClosedLoopUsers(args.users, args.requests, prompt_dist, output_dist, seed=args.seed,
                               think_time=args.think_time, shared_prefix=shared)
    return open_loop(args.requests, args.rate, prompt_dist, output_dist, seed=args.seed,
                     burstiness=args.burstiness, shared_prefix=shared)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("users", "requests", "max_tokens", "max_model_len", "vocab_size"):
        value = getattr(args, flag)
        if value is not None and value < (2 if flag == "max_model_len" else 1):
            parser.error(f"--{flag.replace('_', '-')} must be >= {2 if flag == 'max_model_len' else 1}, got {value}")
    if args.rate is not None and not args.rate > 0:
        parser.error(f"--rate must be > 0 requests/s, got {args.rate}")
    if not args.burstiness > 0:
        parser.error(f"--burstiness must be > 0, got {args.burstiness}")
    if args.burstiness != 1.0 and args.rate is None:
        parser.error("--burstiness applies to open-loop --rate only")
    if args.think_time < 0:
        parser.error(f"--think-time must be >= 0 s, got {args.think_time}")
    if args.think_time and args.users is None:
        parser.error("--think-time applies to closed-loop --users only")
    if args.shared_prefix is not None and args.shared_prefix < 0:
        parser.error(f"--shared-prefix must be >= 0 tokens, got {args.shared_prefix}")
    from .report import parse_slo, summarize_load

    try:
        slo = parse_slo(args.slo)
    except ValueError as err:
        parser.error(str(err))
    try:
        import httpx  # noqa: F401
    except ImportError:
        parser.error('the load generator needs httpx: pip install -e ".[serve]"')

    from .drive import DEFAULT_VOCAB_SIZE, LoadTarget, run_load

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    card = discover(args.url, api_key)
    model = args.model or card.get("id")
    max_model_len = args.max_model_len or int(card.get("max_model_len") or 2048)
    if args.shared_prefix is not None and args.shared_prefix > max_model_len - 2:
        parser.error(f"--shared-prefix {args.shared_prefix} leaves no room in max_model_len {max_model_len}")
    workload = build_workload(parser, args)
    target = LoadTarget(args.url, model=model, max_model_len=max_model_len, max_tokens=args.max_tokens,
                        vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE, seed=args.seed, api_key=api_key,
                        timeout_s=args.timeout)
    result = run_load(target, workload, progress=not args.no_progress)
    summary = summarize_load(result, slo)
    summary["config"] = {"url": args.url, "model": model, "max_model_len": max_model_len,
                         "max_tokens": args.max_tokens, "workload": args.workload, "users": args.users,
                         "rate": args.rate, "burstiness": args.burstiness if args.rate else None,
                         "requests": args.requests, "seed": args.seed}
    from course_lib.sim.metrics import format_table

    from .bench_names import format_bench_serve

    print(format_table({f"load {args.url}": summary}))
    print(format_bench_serve(summary))  # the same run as `vllm bench serve` prints it: TPOT vs ITL in docs/metrics.md
    if summary["requests_failed"]:
        print(f"{summary['requests_failed']} request(s) failed: {summary['errors']}", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if summary["requests_completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
