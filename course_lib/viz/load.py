"""Throughput and tail latency against offered load: where each configuration saturates.

Input: `{configuration name: [(load, summary), ...]}` where `load` is the x value (users or
requests/s) and `summary` a `sim.metrics.summarize` dict. Left panel: output tokens/s; right
panel: the chosen latency percentile. Throughput flattens and latency shoots up at the same
load: the knee is the configuration's capacity.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from course_lib.viz.figure import new_figure


def load_sweep(
    results: Mapping[str, Sequence[tuple[float, Mapping]]],
    load_label: str = "offered load",
    latency_key: str = "latency_s",
    quantile: str = "p99",
    log_latency: bool = False,
) -> Figure:
    fig = new_figure(10.0, 3.8)
    left, right = fig.subplots(1, 2, sharex=True)
    for name, points in results.items():
        points = sorted(points, key=lambda p: p[0])
        loads = [p[0] for p in points]
        left.plot(loads, [p[1].get("throughput_tok_s", 0.0) for p in points], "o-", label=name)
        # A point with no completed request has no latency: leave a gap, not a fake zero.
        tails = [(p[1].get(latency_key) or {}).get(quantile) for p in points]
        right.plot(loads, [float("nan") if t is None else t for t in tails], "o-", label=name)
    left.set_xlabel(load_label)
    left.set_ylabel("throughput (output tok/s)")
    right.set_xlabel(load_label)
    right.set_ylabel(f"{quantile} {latency_key.removesuffix('_s').replace('_', ' ')} (s)")
    if log_latency:
        right.set_yscale("log")
    if results:
        left.legend(fontsize=8)
    return fig
