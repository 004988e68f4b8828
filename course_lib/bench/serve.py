"""`python -m course_lib bench serve`: what HTTP costs. Tokens/s streamed through the server to 64
concurrent clients vs `LLMEngine.generate` in this process, on the same prompts, side by side.

    python -m course_lib bench serve [--streams 64] [--requests 512] [--max-tokens 64] [--repeats 3]
        [--stream-interval-ms MS] [--stream-min-tokens N] [--stream-chunks-per-s R]   # the server's chunking
        [--engine-thread]                                      # the engine in the HTTP process (the old way)

Both sides serve the same greedy requests (the tiny model's task prompts, a fixed answer length
through `ignore_eos`) with the same EngineConfig, 64 at a time: `generate` gets all prompts at
once and runs `--streams` seats; the server (`python -m course_lib serve` in a subprocess, so its
threads do not share this process's interpreter lock with the client) gets `--streams` clients,
each sending its next request when its stream ends. The sides alternate `--repeats` times; the
best run of each is compared (a shared CPU slows one run, never speeds one up).

Reported: the ratio of tokens/s (HTTP / in process; the goal is >= 0.8), best against best and run
by run (a machine whose speed drifts moves both runs of a pair alike), and the latency HTTP
adds per token: for each prompt, its TPOT seen by the client minus its TPOT in process, p50 and
p99 over prompts. The answers must be the same tokens on both sides (checked, reported).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time


def make_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    from course_lib.model.tasks import sample_task

    rng = random.Random(seed)
    return [tokenizer.encode_prompt(sample_task(rng)[0]) for _ in range(n)]


def in_process(model, config, prompts, max_tokens: int) -> dict:
    from course_lib import LLMEngine, SamplingParams

    engine = LLMEngine(model, config)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    tpot = [(o.finish_time - o.first_token_time) / (len(o.token_ids) - 1) for o in outs]
    return {"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens, "tpot": tpot,
            "ids": [o.token_ids for o in outs]}


async def over_http(url: str, prompts, max_tokens: int, streams: int) -> dict:
    from course_lib.loadgen.client import Record, completion_payload, new_session, stream_completion

    records: list = [None] * len(prompts)
    todo = list(range(len(prompts)))[::-1]
    async with new_session(120.0, limit=streams) as client:
        t0 = time.perf_counter()

        async def worker():
            while todo:
                i = todo.pop()
                record = Record(str(i), len(prompts[i]), max_tokens)
                body = completion_payload("tiny", prompts[i], max_tokens, return_token_ids=True)
                records[i] = await stream_completion(client, url + "/v1/completions", body, record, t0)

        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - t0
    failed = [r for r in records if r.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} request(s) failed over HTTP, e.g. {failed[0].error}")
    tokens = sum(r.num_output_tokens for r in records)
    tpot = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1) for r in records]
    itl = [b - a for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    return {"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens, "tpot": tpot, "itl": itl,
            "ids": [r.token_ids for r in records]}


def percentile(values, q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _runs(results) -> str:
    return ", ".join(f"{r['tok_s']:.0f}" for r in results)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=64, help="concurrent HTTP streams = engine seats")
    p.add_argument("--requests", type=int, default=512, help="a run of each side: ~2 s of the tiny model")
    p.add_argument("--max-tokens", type=int, default=64, help="answer length of every request (ignore_eos)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; the best is compared")
    p.add_argument("--stream-interval-ms", type=float, default=None,
                   help="the server's --stream-interval-ms (default: the server's default)")
    p.add_argument("--stream-min-tokens", type=int, default=None,
                   help="the server's --stream-min-tokens (default: the server's default)")
    p.add_argument("--stream-chunks-per-s", type=float, default=None,
                   help="the server's --stream-chunks-per-s (default: the server's default)")
    p.add_argument("--engine-thread", action="store_true",
                   help="the server steps its engine in a thread of the HTTP process (serve --engine-thread)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for flag in ("streams", "requests", "max_tokens", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.max_tokens < 2:
        p.error("--max-tokens must be >= 2 (TPOT needs two tokens)")

    import torch

    torch.set_num_threads(1)
    from course_lib import EngineConfig, load_tiny
    from course_lib.loadgen.client import run_async
    from course_lib.serve.launch import ServerProcess

    model, tokenizer = load_tiny()
    prompts = make_prompts(tokenizer, args.requests, args.seed)
    config = EngineConfig(max_num_seqs=args.streams)
    in_process(model, config, prompts[:8], 8)  # warm up: kernels built, caches hot
    server_args = ["--max-num-seqs", str(args.streams)]
    for flag in ("stream_interval_ms", "stream_min_tokens", "stream_chunks_per_s"):
        if getattr(args, flag) is not None:
            server_args += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.engine_thread:
        server_args.append("--engine-thread")
    server = ServerProcess(server_args)
    try:
        run_async(over_http(server.url, prompts[:8], 8, 8))
        local, remote = [], []
        for _ in range(args.repeats):
            local.append(in_process(model, config, prompts, args.max_tokens))
            remote.append(run_async(over_http(server.url, prompts, args.max_tokens, args.streams)))
    finally:
        server.stop()
    a = max(local, key=lambda r: r["tok_s"])
    b = max(remote, key=lambda r: r["tok_s"])
    same = a["ids"] == b["ids"]
    added = [h - i for h, i in zip(b["tpot"], a["tpot"])]
    ratio = b["tok_s"] / a["tok_s"]
    print(f"{args.requests} requests x {args.max_tokens} tokens, {args.streams} at a time, tiny model, "
          f"{args.repeats} alternating runs per side (best shown)")
    print(f"  in process (LLMEngine.generate): {a['tok_s']:8.0f} tokens/s   "
          f"(runs: {_runs(local)})")
    print(f"  over HTTP ({args.streams} SSE streams):   {b['tok_s']:8.0f} tokens/s   "
          f"(runs: {_runs(remote)}; the server's engine in {'a thread' if args.engine_thread else 'its own process'})")
    paired = [h["tok_s"] / i["tok_s"] for i, h in zip(local, remote)]
    print(f"  ratio HTTP / in process: {ratio:.2f}x, best vs best (goal >= 0.8x); run by run "
          f"(each HTTP run / the in-process run just before it): median {statistics.median(paired):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in paired)})")
    print(f"  added latency per token (client TPOT - in-process TPOT, per prompt): "
          f"p50 {percentile(added, 50) * 1e3:.2f} ms, p99 {percentile(added, 99) * 1e3:.2f} ms")
    print(f"  TPOT in process p50 {statistics.median(a['tpot']) * 1e3:.2f} ms; client ITL p50 "
          f"{percentile(b['itl'], 50) * 1e3:.2f} ms, p99 {percentile(b['itl'], 99) * 1e3:.2f} ms "
          f"({b['tokens'] / max(1, len(b['itl']) + args.requests):.2f} tokens per chunk)")
    print(f"  same tokens on both sides: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
