"""KV cache usage over time: how much of the pool holds real tokens, and how much is wasted.

Input: a sequence of `StepStats` (one run), or `{run name: steps}` for a panel per run. Areas,
as fractions of the pool: used slots (real K/V), waste (allocated to a request but empty:
the tail of its last page, or a contiguous max-length reservation), and free above them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from course_lib.sim.metrics import kv_over_time
from course_lib.viz.figure import axes_or_new, new_figure


def _stepwise(steps: Sequence, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Each step's value holds from its start to the next step's start; close with the last end.
    x = np.append([s.start_time for s in steps], steps[-1].end_time)
    return x, np.append(values, values[-1])


def _draw(steps: Sequence, ax, title: str | None) -> None:
    if steps:
        kv = kv_over_time(steps)
        x, used = _stepwise(steps, kv["used_frac"])
        _, allocated = _stepwise(steps, kv["allocated_frac"])
        ax.fill_between(x, 0, used, step="post", color="#4e79a7", label="used")
        ax.fill_between(x, used, allocated, step="post", color="#e15759", alpha=0.7, label="allocated, unused (waste)")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("fraction of KV pool")
    if title:
        ax.set_title(title)


def kv_utilisation(runs: Sequence | Mapping[str, Sequence], ax=None) -> Figure:
    if not isinstance(runs, Mapping):
        fig, ax = axes_or_new(ax, 8.0, 3.5)
        _draw(list(runs), ax, "KV pool over time")
        return fig
    fig = new_figure(8.0, 2.8 * max(1, len(runs)))
    axes = np.atleast_1d(fig.subplots(max(1, len(runs)), 1, sharey=True))
    for axis, (name, steps) in zip(axes, runs.items()):
        _draw(list(steps), axis, name)
    return fig
