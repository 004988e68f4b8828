"""The simulation dashboard: sliders for page size, load, pool size and admission policy.

Two layers, so the logic is testable without a browser:

- `render_dashboard(values, run_fn) -> Figure` is pure: it calls
  `run_fn(**values)` -> `(summary, steps, requests)` and draws the plots and a table.
  `values` holds `page_size`, `kv_tokens`, `admission` and the load: `users` (closed loop)
  or `rate` (open loop, requests/s).
- `simulation_dashboard(run_fn, ...)` builds the ipywidgets (imported lazily: plain
  `course_lib` never needs them) and re-renders when a control is released.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from matplotlib.figure import Figure

from course_lib.sim.metrics import format_table
from course_lib.viz.figure import new_figure, png_bytes
from course_lib.viz.kv_usage import kv_utilisation
from course_lib.viz.page_map import page_pool_map
from course_lib.viz.queue import queue_lengths
from course_lib.viz.timeline import timeline

ADMISSION_POLICIES = ("none", "reserve", "watermark")
DASHBOARD_KEYS = ("page_size", "users", "rate", "kv_tokens", "admission")
TIMELINE_ROWS = 30  # more rows than this turn into a grey smear at dashboard size

RunFn = Callable[..., tuple]


def _describe(values: Mapping) -> str:
    load = f"{values['users']} users" if "users" in values else f"{values.get('rate')} req/s"
    return (
        f"page size {values.get('page_size')} | {load} | KV pool {values.get('kv_tokens')} tokens"
        f" | admission: {values.get('admission')}"
    )


def failure_summary(requests) -> str:
    """Why the run's failed requests failed, one line per reason with its count ('' if none failed)."""
    reasons: dict[str, int] = {}
    for r in requests:
        if getattr(r, "finish_reason", None) == "error":
            error = getattr(r, "error", None) or "unknown error"
            if "mid-generation" in error:
                why = "ran out of KV pages mid-generation (preemption off)"
            elif "whole pool" in error:
                why = "refused: the request is larger than the whole KV pool"
            else:
                why = error[:70]
            reasons[why] = reasons.get(why, 0) + 1
    return "\n".join(f"{n} failed: {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


def render_dashboard(values: Mapping, run_fn: RunFn) -> Figure:
    """Run one simulation with the widget `values` and draw: the request timeline, the page
    pool (or the queue lengths when the run recorded no page owners), KV usage over time, and
    the summary table."""
    unknown = set(values) - set(DASHBOARD_KEYS)
    if unknown:
        raise ValueError(f"unknown dashboard values {sorted(unknown)}; expected some of {DASHBOARD_KEYS}")
    summary, steps, requests = run_fn(**values)
    fig = new_figure(13.0, 8.0)
    axes = fig.subplot_mosaic([["timeline", "pages"], ["kv", "table"]])
    timeline(requests, ax=axes["timeline"], title=f"first {TIMELINE_ROWS} requests", max_rows=TIMELINE_ROWS)
    if any(getattr(s, "page_owners", None) is not None for s in steps):
        page_pool_map(steps, ax=axes["pages"])
    else:
        queue_lengths(steps, ax=axes["pages"])
    kv_utilisation(steps, ax=axes["kv"])
    table = axes["table"]
    table.axis("off")
    table.text(0.0, 1.0, format_table({"this run": summary}), family="monospace", fontsize=9, va="top")
    failures = failure_summary(requests)
    if failures:  # why requests failed: a pool smaller than one request reads differently from a full pool
        table.set_title(failures, loc="left", family="monospace", fontsize=9, color="#c00")
    fig.suptitle(_describe(values))
    return fig


def simulation_dashboard(
    run_fn: RunFn,
    page_sizes=(1, 2, 4, 8, 16, 32, 64),
    page_size: int = 16,
    load_kind: str = "users",
    load_range: tuple[float, float, float] = (1, 128, 1),
    load: float = 16,
    kv_tokens_range: tuple[int, int, int] = (256, 16384, 256),
    kv_tokens: int = 4096,
    admission: str = "none",
    dpi: int = 80,
):
    """An ipywidgets box: controls on top, the rendered dashboard below. `load_kind` is
    "users" (integer slider) or "rate" (requests/s, float slider)."""
    import ipywidgets as widgets  # lazily: only notebooks need it

    if load_kind not in ("users", "rate"):
        raise ValueError(f"load_kind must be 'users' or 'rate', got {load_kind!r}")
    if page_size not in page_sizes:
        raise ValueError(f"page_size {page_size} is not one of the slider's page sizes {tuple(page_sizes)}")
    style = {"description_width": "initial"}
    lo, hi, step = load_range
    load_slider_cls = widgets.IntSlider if load_kind == "users" else widgets.FloatSlider
    controls = {
        "page_size": widgets.SelectionSlider(
            options=list(page_sizes), value=page_size, description="page size", continuous_update=False, style=style
        ),
        load_kind: load_slider_cls(
            min=lo, max=hi, step=step, value=load, continuous_update=False, style=style,
            description="users" if load_kind == "users" else "rate (req/s)",
        ),
        "kv_tokens": widgets.IntSlider(
            min=kv_tokens_range[0], max=kv_tokens_range[1], step=kv_tokens_range[2], value=kv_tokens,
            description="KV pool (tokens)", continuous_update=False, style=style,
        ),
        "admission": widgets.ToggleButtons(options=list(ADMISSION_POLICIES), value=admission, description="admission"),
    }
    image = widgets.Image(format="png")
    message = widgets.HTML()

    def redraw(_change=None):
        values = {key: control.value for key, control in controls.items()}
        message.value = "<i>running...</i>"
        try:
            image.value = png_bytes(render_dashboard(values, run_fn), dpi=dpi)
            message.value = ""
        except ValueError as e:  # e.g. a pool too small for one prompt: say so, keep the last picture
            message.value = f"<b style='color:#c00'>{e}</b>"

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    first_row, second_row = list(controls.values())[:2], list(controls.values())[2:]
    return widgets.VBox([widgets.HBox(first_row), widgets.HBox(second_row), message, image])
