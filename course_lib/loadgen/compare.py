"""A load run next to the simulator's prediction of it: one figure, one panel per latency metric.

Each panel is the CDF of that metric over the completed requests of every run, in milliseconds,
with a dot at the p99 (the tail is where a server and its model part ways first). The legend
(titled with `title`) sits above the panels, never on a curve.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from course_lib.sim.metrics import values_of
from course_lib.viz.figure import new_figure

PANELS = {"ttft": "time to first token (ms)", "tpot": "time per output token (ms)",
          "latency": "end-to-end latency (ms)"}


def measured_vs_predicted(runs: Mapping[str, Sequence], metrics: Sequence[str] = ("ttft", "tpot", "latency"),
                          title: str | None = None) -> Figure:
    """`runs`: {name: request records} (load-generator Records or simulator RequestOutputs alike)."""
    fig = new_figure(4.0 * len(metrics), 3.6)
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    for ax, metric in zip(axes, metrics):
        for i, (name, records) in enumerate(runs.items()):
            values = np.sort(np.asarray(values_of(records, metric), dtype=float)) * 1e3
            if values.size == 0:
                continue
            colour = f"C{i}"
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color=colour,
                    label=name if ax is axes[0] else None)
            ax.plot([np.percentile(values, 99)], [0.99], "o", color=colour, markersize=4)
        ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xlabel(PANELS.get(metric, metric))
        ax.set_xlim(left=0)
        ax.xaxis.set_major_locator(MaxNLocator(5))  # five-digit milliseconds must not collide
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("fraction of requests")
    # "outside": constrained layout (new_figure's) makes room for the legend above the panels.
    fig.legend(loc="outside upper center", ncol=max(1, len(runs)), frameon=False, fontsize=9, title=title,
               title_fontsize=10)
    return fig
