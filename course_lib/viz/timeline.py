"""The turnstile timeline: one row per request, showing when it waited, prefilled and decoded.

Input: a sequence of request records (dicts or objects, the same records `sim.metrics` reads)
with `request_id`, `arrival_time`, `first_scheduled_time`, `first_token_time`, `finish_time`.
Spans drawn per row:

    waiting  arrival_time         .. first_scheduled_time
    prefill  first_scheduled_time .. first_token_time
    decode   first_token_time     .. finish_time

A missing time ends the row where the known spans end (a request still running, or one that
failed before its first token); failed requests get a red cross at their finish.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from course_lib.sim.metrics import is_failed, record_value
from course_lib.viz.figure import axes_or_new, new_figure

PHASE_COLORS = {"waiting": "#d9d9d9", "prefill": "#f28e2b", "decode": "#4e79a7"}
_PHASES = (
    ("waiting", "arrival_time", "first_scheduled_time"),
    ("prefill", "first_scheduled_time", "first_token_time"),
    ("decode", "first_token_time", "finish_time"),
)
_MAX_LABELLED_ROWS = 40  # beyond this, request ids overprint each other


def timeline(
    requests: Sequence,
    ax=None,
    title: str | None = None,
    max_rows: int | None = None,
    sort_by_arrival: bool = True,
) -> Figure:
    """Draw one horizontal bar per request (first request on top); returns the figure."""
    rows = list(requests)
    if sort_by_arrival:
        rows.sort(key=lambda r: record_value(r, "arrival_time", 0.0))
    if max_rows is not None:
        rows = rows[:max_rows]
    fig, ax = axes_or_new(ax, 8.0, max(2.5, 0.18 * len(rows) + 1.0))
    for phase, start_key, end_key in _PHASES:
        # One barh call per phase (not per request): hundreds of rows stay fast to draw.
        ys, lefts, widths = [], [], []
        for y, record in enumerate(rows):
            start, end = record_value(record, start_key), record_value(record, end_key)
            if start is not None and end is not None and end >= start:
                ys.append(y)
                lefts.append(start)
                widths.append(end - start)
        ax.barh(ys, widths, left=lefts, height=0.8, color=PHASE_COLORS[phase], label=phase)
    failed = [(record_value(r, "finish_time"), y) for y, r in enumerate(rows) if is_failed(r)]
    failed = [(t, y) for t, y in failed if t is not None]
    if failed:
        ax.plot(*zip(*failed), "x", color="red", markersize=6, linestyle="none", label="failed")
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # first request on top
    if 0 < len(rows) <= _MAX_LABELLED_ROWS:
        ax.set_yticks(range(len(rows)), [str(record_value(r, "request_id", i)) for i, r in enumerate(rows)], fontsize=7)
    else:
        ax.set_ylabel("request")
    ax.set_xlabel("time (s)")
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    return fig


def bus_vs_turnstile(
    static_run: Sequence,
    continuous_run: Sequence,
    max_rows: int | None = 40,
    titles: tuple[str, str] = ("Static batching: the bus", "Continuous batching: the turnstile"),
) -> Figure:
    """The same workload under both schedulers, stacked with a shared time axis."""
    rows = min(len(static_run), len(continuous_run), max_rows or 10**9)
    fig = new_figure(9.0, max(4.0, 2 * (0.18 * rows + 1.0)))
    top, bottom = fig.subplots(2, 1, sharex=True)
    timeline(static_run, ax=top, title=titles[0], max_rows=max_rows)
    timeline(continuous_run, ax=bottom, title=titles[1], max_rows=max_rows)
    return fig
