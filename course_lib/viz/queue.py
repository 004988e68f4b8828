"""Queue lengths over time: requests running (holding a batch slot) and waiting.

Input: a sequence of `StepStats`. Under overload the waiting line climbs without bound (open
loop) or sits at `users - running` (closed loop); under preemption running dips as waiting jumps.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from course_lib.sim.metrics import queue_over_time
from course_lib.viz.figure import axes_or_new


def queue_lengths(steps: Sequence, ax=None, title: str | None = "Running and waiting requests") -> Figure:
    fig, ax = axes_or_new(ax, 8.0, 3.5)
    if steps:
        q = queue_over_time(steps)
        ax.step(q["time"], q["running"], where="post", label="running")
        ax.step(q["time"], q["waiting"], where="post", label="waiting")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    if title:
        ax.set_title(title)
    return fig
