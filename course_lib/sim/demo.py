"""`python -m course_lib demo`: the course's headline comparison, measured side by side.

100 closed-loop users send 400 chat-like requests to a simulated H100 serving Llama-3-8B
(scripted runner, roofline clock), and the same KV memory (20,480 tokens) is run four ways:
static or continuous batching, contiguous or paged KV, each with admission control off and on
(watermark). Then: the "break it" experiment (twice the users in the same memory: without
admission control the pool overflows, requests are preempted, or fail when preemption is off),
a load sweep, prefix caching on and off for a shared 512-token system prompt, the plots, and a
few real requests served by the tiny model on this CPU. Every simulated run is independent and
deterministic; they run side by side in `--jobs` forked processes.

Setup choices (all printed, all flags):

- KV pool 20,480 tokens: paged = 1,280 pages of 16 tokens; contiguous = 10 reservations of
  max_model_len = 2,048 tokens each (the default workload's longest request is 1,024 + 1,024).
- 256 batch seats and a 2,048-token step budget with chunked prefill, so the KV pool, not the
  seat count, is what limits each configuration. Think time 0: every user always has a request
  in flight. Per-request output cap (max_tokens) 1,024, the workload's longest output: the
  scripted request stops at its own length; the cap is what a reservation has to plan for.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

LAYOUTS = (("static", "contiguous"), ("static", "paged"), ("continuous", "contiguous"), ("continuous", "paged"))
ADMISSIONS = ("none", "watermark")
_SHORT = {"static": "st", "continuous": "cb", "contiguous": "ctg", "paged": "pg", "none": "none",
          "watermark": "wm", "reserve": "rsv"}
LEGEND = ("st = static batching (the bus), cb = continuous batching (the turnstile); ctg = contiguous KV, "
          "pg = paged KV;\nnone / wm = admission control off / watermark (keep 5% of the pool free when admitting)")


def short_name(scheduler: str, kv: str, admission: str) -> str:
    return f"{_SHORT[scheduler]}/{_SHORT[kv]}/{_SHORT[admission]}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo_results", metavar="DIR", help="folder for the plots (default demo_results)")
    p.add_argument("--users", type=int, default=100, help="closed-loop users (default 100)")
    p.add_argument("--requests", type=int, default=400, help="requests per run (default 400)")
    p.add_argument("--kv-tokens", type=int, default=20480, help="KV memory of every configuration, tokens")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048, help="context length (the contiguous reservation)")
    p.add_argument("--sweep-users", default=None, metavar="N,N,...",
                   help="user counts of the load sweep (default: 1/4, 1/2, 1 and 2 times --users)")
    p.add_argument("--shared-prefix", type=int, default=512, metavar="T",
                   help="system-prompt length of the prefix-caching comparison (0 skips it)")
    p.add_argument("--gpu", default="H100")
    p.add_argument("--model-shape", default="llama-3-8b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-model", action="store_true", help="skip the real tiny-model section")
    p.add_argument("--progress", action="store_true", help="show a progress bar per run")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="runs side by side in forked processes (default: 2, or 1 on a 1-core machine)")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--users", args.users), ("--requests", args.requests), ("--page-size", args.page_size)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.kv_tokens < args.max_model_len:
        parser.error(f"--kv-tokens {args.kv_tokens} cannot hold one contiguous request of --max-model-len "
                     f"{args.max_model_len}")
    if not 0 <= args.shared_prefix < args.max_model_len // 2:
        parser.error(f"--shared-prefix must be in [0, {args.max_model_len // 2}) (half of --max-model-len), "
                     f"got {args.shared_prefix}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        sweep_users = (sorted({int(x) for x in args.sweep_users.split(",")}) if args.sweep_users
                       else sorted({max(1, args.users // 4), max(1, args.users // 2), args.users, 2 * args.users}))
    except ValueError:
        parser.error(f"--sweep-users must be comma-separated integers, got {args.sweep_users!r}")
    if min(sweep_users) < 1:
        parser.error(f"--sweep-users must all be >= 1, got {sweep_users}")

    import matplotlib

    matplotlib.use("Agg")
    from course_lib.sim.metrics import format_table
    from course_lib.sim.simulate import make_engine_config
    from course_lib.sim.sweep import run_many
    from course_lib.sim.workload import ClosedLoopUsers

    t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    common = dict(kv_tokens=args.kv_tokens, page_size=args.page_size, max_model_len=args.max_model_len)
    sim = dict(gpu=args.gpu, model_shape=args.model_shape, seed=args.seed, progress=args.progress)

    def task(users, scheduler, kv, admission, preemption="recompute", record=False, prefix=0, caching=False):
        config = make_engine_config(scheduler=scheduler, kv=kv, admission=admission, preemption=preemption,
                                    record_page_owners=record, prefix_caching=caching, **common)
        workload = ClosedLoopUsers(users, args.requests, seed=args.seed, shared_prefix=prefix)
        return dict(engine_config=config, workload=workload, label=short_name(scheduler, kv, admission), **sim)

    # Every run is independent: build them all, then run them side by side (args.jobs processes).
    heavy = 2 * args.users
    headline_keys = [(s, k, a) for s, k in LAYOUTS for a in ADMISSIONS]
    breakit_keys = [("none", "recompute"), ("none", "fail"), ("watermark", "fail"), ("reserve", "fail")]
    sweep_configs = {"static + contiguous": ("static", "contiguous"), "continuous + paged": ("continuous", "paged")}
    sweep_keys = [(name, n) for name in sweep_configs for n in sweep_users if n != args.users]
    tasks = [task(args.users, s, k, a, record=(s == "continuous" and a == "watermark")) for s, k, a in headline_keys]
    tasks += [task(heavy, "continuous", "paged", a, p) for a, p in breakit_keys]
    tasks += [task(n, *sweep_configs[name], "watermark") for name, n in sweep_keys]
    prefix_keys = [False, True] if args.shared_prefix else []
    tasks += [task(args.users, "continuous", "paged", "watermark", prefix=args.shared_prefix, caching=c)
              for c in prefix_keys]
    print(f"Setup: {args.users} closed-loop users (think time 0), {args.requests} requests, chat-like lengths "
          f"(prompts median 64 / p99 400 tokens, outputs median 128 / mean 200, up to 1024), scripted runner,\n"
          f"simulated {args.gpu} serving {args.model_shape} (roofline + 2 ms per step). Same KV memory for all: "
          f"{args.kv_tokens} tokens = {args.kv_tokens // args.page_size} pages of {args.page_size} (paged) or "
          f"{args.kv_tokens // args.max_model_len} reservations of max_model_len {args.max_model_len} (contiguous).\n"
          f"256 batch seats, 2048-token step budget, chunked prefill, preemption by recompute.\n")
    print(f"Running {len(tasks)} simulations ({args.jobs} at a time)...", flush=True)
    results = iter(run_many(tasks, processes=args.jobs))
    t_sim = time.perf_counter() - t0

    runs = {key: next(results) for key in headline_keys}
    breakit = {f"{_SHORT[a]}/{p}": next(results) for a, p in breakit_keys}
    swept = {key: next(results) for key in sweep_keys}
    prefix_runs = {f"prefix caching {'on' if c else 'off'}": next(results) for c in prefix_keys}

    # ---- 1. the headline table ------------------------------------------------------------
    print()
    print(format_table({short_name(*key): r.summary for key, r in runs.items()}))
    print(LEGEND)
    print()
    for ok, text in check_claims(runs, args):
        print(f"  [{'ok' if ok else 'NOT MET'}] {text}")

    # ---- 2. break it: twice the users in the same memory -------------------------------------
    print(f"\nBreak it: {heavy} users in the same {args.kv_tokens}-token pool (continuous + paged). Without "
          f"admission control the pool overflows mid-generation: requests are preempted and recomputed,\nor fail "
          f"when preemption is off ('fail'). Watermark keeps headroom; reserve plans for every request's "
          f"worst case (prompt + max_tokens)\nand never preempts, at a price in throughput.")
    print(format_table({name: r.summary for name, r in breakit.items()}))
    lost = {name: r.summary["requests_total"] - r.summary["requests_completed"] - r.summary["requests_failed"]
            for name, r in breakit.items()}
    print(f"  requests lost (neither completed nor failed with a reason): {lost}")

    # ---- 3. load sweep ------------------------------------------------------------------------
    sweep = {name: [(n, (runs[(*sweep_configs[name], "watermark")] if n == args.users else swept[(name, n)]).summary)
                    for n in sweep_users] for name in sweep_configs}
    print(f"\nLoad sweep ({args.requests} requests per point, admission watermark):")
    print(f"  {'users':>6}  " + "  ".join(f"{name + ' tok/s':>26}  {'p99 latency (s)':>15}" for name in sweep))
    for i, n in enumerate(sweep_users):
        cells = []
        for points in sweep.values():
            s = points[i][1]
            cells.append(f"{s['throughput_tok_s']:>26.0f}  {s['latency_s']['p99']:>15.2f}")
        print(f"  {n:>6}  " + "  ".join(cells))

    # ---- 4. prefix caching ---------------------------------------------------------------------
    if prefix_runs:
        print(f"\nPrefix caching: every prompt starts with the same {args.shared_prefix}-token system prompt "
              f"({args.users} users, continuous + paged, watermark).")
        print(format_table({name: r.summary for name, r in prefix_runs.items()}))
        off, on = (r.summary for r in prefix_runs.values())
        print(f"  caching on: TTFT p50 {1e3 * on['ttft_s']['p50']:.1f} ms vs {1e3 * off['ttft_s']['p50']:.1f} ms, "
              f"throughput {on['throughput_tok_s'] / off['throughput_tok_s']:.2f}x, "
              f"{100 * on['prefix_hit_rate']:.0f}% of prompt tokens served from the cache")

    # ---- 5. plots -----------------------------------------------------------------------------
    t_plots = time.perf_counter()
    paths = save_demo_plots(runs, sweep, out_dir)
    t_plots = time.perf_counter() - t_plots

    # ---- 6. real tokens -----------------------------------------------------------------------
    if not args.no_model:
        real_model_section(args.seed)

    print(f"\nDemo ran in {time.perf_counter() - t0:.1f} s (simulations {t_sim:.1f} s, plots {t_plots:.1f} s). "
          f"Plots saved in {out_dir.resolve()}:")
    for path in paths:
        print(f"  {path.name}")
    return 0


def check_claims(runs: dict, args) -> list[tuple[bool, str]]:
    """The README's claims, checked against this run's numbers (printed, never enforced)."""
    sc, cp = runs[("static", "contiguous", "watermark")].summary, runs[("continuous", "paged", "watermark")].summary
    sc0, cp0 = runs[("static", "contiguous", "none")].summary, runs[("continuous", "paged", "none")].summary
    cc = runs[("continuous", "contiguous", "watermark")].summary
    ratio = cp["throughput_tok_s"] / sc["throughput_tok_s"] if sc["throughput_tok_s"] else float("inf")
    ratio0 = cp0["throughput_tok_s"] / sc0["throughput_tok_s"] if sc0["throughput_tok_s"] else float("inf")
    waste = {s: max(runs[(s, "paged", a)].summary["kv_waste_frac"] for a in ADMISSIONS)
             for s in ("continuous", "static")}
    paged_waste = max(waste.values())
    contig_waste = min(runs[(s, "contiguous", a)].summary["kv_waste_frac"] for s in ("static", "continuous")
                       for a in ADMISSIONS)
    peak = cp["peak_running"] / max(1, cc["peak_running"])
    admitted = [runs[(s, k, "watermark")].summary for s, k in LAYOUTS]
    nothing_lost = all(s["requests_completed"] == s["requests_total"] == args.requests and s["requests_failed"] == 0
                       for s in admitted)
    return [
        (ratio >= 3 and cp["latency_s"]["p99"] < sc["latency_s"]["p99"],
         f"continuous + paged serves {ratio:.1f}x the throughput of static + contiguous ({ratio0:.1f}x without "
         f"admission control), p99 latency {cp['latency_s']['p99']:.2f} s vs {sc['latency_s']['p99']:.2f} s "
         f"(target >= 3x, lower p99)"),
        (paged_waste <= 0.04,
         f"paged KV wastes {100 * waste['continuous']:.1f}% (continuous) / {100 * waste['static']:.1f}% (static) "
         f"of allocated slots at page {args.page_size} (target <= 4%)"),
        (contig_waste >= 0.5, f"contiguous KV wastes at least {100 * contig_waste:.1f}% (target >= 50%)"),
        (peak >= 5,
         f"paged runs {peak:.1f}x as many requests at once: peak {cp['peak_running']} vs {cc['peak_running']} "
         f"(continuous, target >= 5x)"),
        (nothing_lost, "with admission control on, every request completed: none failed, none lost"),
    ]


def save_demo_plots(runs: dict, sweep: dict, out_dir: Path) -> list[Path]:
    from course_lib.viz import bus_vs_turnstile, kv_utilisation, latency_cdfs, load_sweep, page_pool_map
    from course_lib.viz.figure import new_figure

    on = {short_name(s, k, "watermark"): runs[(s, k, "watermark")] for s, k in LAYOUTS}
    figures = {
        "bus_vs_turnstile.png": bus_vs_turnstile(
            runs[("static", "contiguous", "watermark")].requests, runs[("continuous", "paged", "watermark")].requests,
            titles=("Static batching + contiguous KV: the bus", "Continuous batching + paged KV: the turnstile")),
        "latency_cdfs.png": latency_cdfs({name: r.requests for name, r in on.items()}, log_x=True),
        "kv_utilisation.png": kv_utilisation({name: r.steps for name, r in on.items()}),
        "load_sweep.png": load_sweep(sweep, load_label="closed-loop users"),
    }
    fig = new_figure(10.0, 7.0)
    top, bottom = fig.subplots(2, 1)
    page_pool_map(runs[("continuous", "contiguous", "watermark")].steps, ax=top,
                  title="contiguous: one max_model_len reservation per request")
    page_pool_map(runs[("continuous", "paged", "watermark")].steps, ax=bottom,
                  title="paged: pages of 16 tokens, handed out as requests grow")
    figures["page_pool_map.png"] = fig
    paths = []
    for name, figure in figures.items():
        figure.savefig(out_dir / name, dpi=100)
        paths.append(out_dir / name)
    return paths


def real_model_section(seed: int = 0, users: int = 4, requests: int = 8) -> None:
    """A few requests served by the tiny model through the same engine, on this CPU (wall clock)."""
    from course_lib.sim import cli
    from course_lib.sim.metrics import format_table
    from course_lib.sim.simulate import make_engine_config, simulate, task_prompt
    from course_lib.sim.workload import ClosedLoopUsers

    print(f"\nReal tokens: the tiny model, {users} users, {requests} requests, continuous + paged, "
          "wall clock on this CPU.")
    try:
        model, tokenizer = cli._load_model()
    except (FileNotFoundError, ValueError) as err:
        print(f"  skipped: {err}")
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from more; spinning threads on a shared CPU cost a lot
    try:
        config = make_engine_config(kv_tokens=4096, max_num_seqs=64, max_num_batched_tokens=512)
        result = simulate(config, ClosedLoopUsers(users, requests, seed=seed), runner="model", clock="wall",
                          model=model, tokenizer=tokenizer, max_tokens=160, seed=seed, progress=False)
    finally:
        torch.set_num_threads(threads)
    for r in result.requests:
        if tokenizer is None:
            print(f"  {r.request_id}: {len(r.prompt_token_ids)} prompt tokens -> {r.token_ids[:12]}... "
                  f"({len(r.token_ids)} tokens, {r.finish_reason})")
            continue
        text = result.prompt_texts.get(r.request_id, "?")
        expected = task_prompt(r.request_id, seed)[1]
        answer = tokenizer.decode(r.token_ids)
        mark = "(correct)" if answer == expected else f"(expected {expected!r})"
        shown = answer if len(answer) <= 48 else answer[:45] + "..."
        print(f"  {text!r:<28} -> {shown!r} {mark}  [{r.finish_reason}, {len(r.token_ids)} tokens]")
    print(format_table({"tiny model, wall clock": result.summary}))


if __name__ == "__main__":
    sys.exit(main())
