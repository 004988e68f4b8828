"""Load sweeps: the same engine configurations under more and more closed-loop users.

Every point serves the same request lengths (the workload's length streams depend only on the
seed), so the curves differ by load alone. The result feeds `course_lib.viz.load_sweep`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from course_lib.engine_config import EngineConfig
from course_lib.sim.simulate import simulate
from course_lib.sim.workload import ClosedLoopUsers


def users_sweep(
    configs: Mapping[str, EngineConfig],
    users: Sequence[int],
    requests: int,
    *,
    seed: int = 0,
    known: Mapping[tuple[str, int], dict] | None = None,
    progress: bool = False,
    **simulate_kwargs,
) -> dict[str, list[tuple[int, dict]]]:
    """`{config name: [(users, summary), ...]}` for every config at every user count.

    `known`: summaries already measured, keyed by `(config name, users)`, reused instead of
    re-run (e.g. the headline runs of the demo). Other keyword arguments go to `simulate`.
    """
    known = known or {}
    results: dict[str, list[tuple[int, dict]]] = {}
    for name, config in configs.items():
        points = []
        for n in users:
            summary = known.get((name, n))
            if summary is None:
                workload = ClosedLoopUsers(n, requests, seed=seed)
                summary = simulate(config, workload, seed=seed, progress=progress, label=f"{name} @ {n} users",
                                   **simulate_kwargs).summary
            points.append((n, summary))
        results[name] = points
    return results


def _run_one(task: dict):
    result = simulate(**task)
    result.engine = None  # holds closures; not needed once the run is measured, and not picklable
    return result


def run_many(tasks: Sequence[dict], processes: int = 1) -> list:
    """`simulate(**task)` for every task, in order; with `processes > 1`, in forked worker
    processes (each run is single-threaded Python, so independent runs parallelise cleanly).
    The results' `engine` is dropped. Falls back to one process where fork is unavailable."""
    tasks = list(tasks)
    if processes <= 1 or len(tasks) <= 1:
        return [_run_one(t) for t in tasks]
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")  # children inherit the imported modules: no re-import
    except ValueError:
        return [_run_one(t) for t in tasks]
    with ctx.Pool(min(processes, len(tasks))) as pool:
        return pool.map(_run_one, tasks, chunksize=1)


# ---------------------------------------------------------------------------------------------
# Scale: how the simulator's own cost grows with the number of requests
# ---------------------------------------------------------------------------------------------


def scale_curve(sizes: Sequence[int], users: int = 100, seed: int = 0,
                config: EngineConfig | None = None) -> list[dict]:
    """Wall and CPU seconds to simulate `n` scripted requests (closed loop, simulated clock) for each n."""
    import time

    from course_lib.sim.simulate import make_engine_config

    config = config or make_engine_config()
    rows = []
    for n in sizes:
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(config, ClosedLoopUsers(users, n, seed=seed), seed=seed, progress=False)
        rows.append({"requests": n, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                     "steps": len(result.steps), "completed": result.summary["requests_completed"],
                     "simulated_s": result.summary["sim_time_s"]})
    return rows


def scale_plot(rows: Sequence[dict]):
    import numpy as np

    from course_lib.viz.figure import new_figure

    fig = new_figure(6.5, 4.0)
    ax = fig.add_subplot()
    n = np.array([r["requests"] for r in rows], dtype=float)
    for key, label, style in (("wall_s", "wall time", "o-"), ("cpu_s", "CPU time (this process)", "s--")):
        t = np.array([r[key] for r in rows])
        ax.plot(n, t, style, label=label)
        slope = float(np.dot(n, t) / np.dot(n, n))  # least squares through the origin: t = slope * n
        ax.plot(n, slope * n, ":", color="grey", linewidth=0.8)
    ax.set_xlabel("scripted requests simulated")
    ax.set_ylabel("seconds")
    ax.set_title("Simulator cost vs number of requests (dotted: linear fit)")
    ax.set_xlim(0, None)
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    return fig


def main(argv=None) -> int:
    """`python -m course_lib.sim.sweep --scale 1000,2000,5000,10000 --plot docs/scale.png`"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m course_lib.sim.sweep", description="simulator cost vs requests")
    p.add_argument("--scale", default="1000,2000,5000,10000", help="comma-separated request counts")
    p.add_argument("--users", type=int, default=100)
    p.add_argument("--plot", metavar="PNG", help="save the curve here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.scale.split(",")]
    rows = scale_curve(sizes, users=args.users)
    print(f"{'requests':>9} {'wall s':>8} {'CPU s':>8} {'steps':>7} {'ms/req (CPU)':>13}")
    for r in rows:
        print(f"{r['requests']:>9} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['steps']:>7} "
              f"{1e3 * r['cpu_s'] / r['requests']:>13.2f}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        scale_plot(rows).savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
