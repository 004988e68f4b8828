"""Latency CDFs: several runs overlaid, one panel per metric (TTFT, TPOT, end-to-end).

Input: `{run name: request records}` (the records `sim.metrics` reads). Each panel plots the
empirical CDF of that metric over the run's completed requests, with a dot at the p99: the
tail is where schedulers differ, so the eye should land there.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from course_lib.sim.metrics import values_of
from course_lib.viz.figure import new_figure

METRIC_LABELS = {
    "ttft": "time to first token (s)",
    "tpot": "time per output token (s)",
    "latency": "end-to-end latency (s)",
}


def latency_cdfs(
    runs: Mapping[str, Sequence],
    metrics: Sequence[str] = ("ttft", "tpot", "latency"),
    log_x: bool = False,
) -> Figure:
    fig = new_figure(4.0 * len(metrics), 3.5)
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    for ax, metric in zip(axes, metrics):
        for i, (name, requests) in enumerate(runs.items()):
            values = np.sort(values_of(requests, metric))
            if values.size == 0:
                continue
            colour = f"C{i}"
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color=colour, label=name)
            ax.plot([np.percentile(values, 99)], [0.99], "o", color=colour, markersize=4)
        ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xlabel(METRIC_LABELS.get(metric, metric))
        ax.set_ylim(0, 1.02)
        if log_x:
            ax.set_xscale("log")
    axes[0].set_ylabel("fraction of requests")
    if runs:
        axes[0].legend(fontsize=8, loc="lower right")
    return fig
