"""Plots (pure functions returning matplotlib Figures) and the notebook dashboard.

    timeline / bus_vs_turnstile   per-request waiting, prefill, decode spans
    page_pool_map                 owner of every physical KV page, step by step
    latency_cdfs                  TTFT / TPOT / latency CDFs, runs overlaid
    load_sweep                    throughput and tail latency vs offered load
    kv_utilisation                used and wasted KV over time
    queue_lengths                 running and waiting requests over time
    parallel_sampling_memory_plot KV pages for n samples, shared vs separate (sim/parallel_sampling.py)
    render_dashboard / simulation_dashboard   (widgets.py; ipywidgets imported lazily)
"""
from course_lib.viz.figure import png_bytes
from course_lib.viz.kv_usage import kv_utilisation
from course_lib.viz.latency import latency_cdfs
from course_lib.viz.load import load_sweep
from course_lib.viz.page_map import page_pool_map
from course_lib.viz.page_grid import page_grid  # noqa: F401  (the pool as grids of pages at a few moments)
from course_lib.viz.parallel_sampling import parallel_sampling_memory_plot
from course_lib.viz.queue import queue_lengths
from course_lib.viz.timeline import bus_vs_turnstile, timeline
from course_lib.viz.widgets import render_dashboard, simulation_dashboard

__all__ = [
    "bus_vs_turnstile",
    "kv_utilisation",
    "latency_cdfs",
    "load_sweep",
    "page_pool_map",
    "parallel_sampling_memory_plot",
    "png_bytes",
    "queue_lengths",
    "render_dashboard",
    "simulation_dashboard",
    "timeline",
]
