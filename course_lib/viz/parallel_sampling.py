"""KV memory of parallel sampling with and without sharing: bars per n, the saving written on top.

Input: the rows of `course_lib.sim.parallel_sampling.parallel_sampling_memory` (the anchor is the
vLLM paper's parallel-sampling figure: memory saved by sharing the prompt's blocks, growing with n).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from course_lib.viz.figure import axes_or_new

NOT_SHARED, SHARED = "#E69F00", "#0072B2"  # Okabe-Ito orange and blue: apart for every colour vision


def parallel_sampling_memory_plot(rows: list[dict], ax=None, title: str | None = None) -> Figure:
    fig, ax = axes_or_new(ax, 7.0, 3.8)
    ns = [r["n"] for r in rows]
    x = np.arange(len(rows))
    width = 0.38
    ax.bar(x - width / 2, [r["unshared_pages"] for r in rows], width, color=NOT_SHARED,
           label="n separate requests (no sharing)")
    bars = ax.bar(x + width / 2, [r["shared_pages"] for r in rows], width, color=SHARED,
                  label="one request, n samples sharing the prompt's pages")
    for bar, r in zip(bars, rows):
        if r["n"] > 1:
            ax.annotate(f"-{100 * r['saved_frac']:.0f}%", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, [str(n) for n in ns])
    ax.set_xlabel("samples per prompt (n)")
    ax.set_ylabel(f"peak KV pages ({rows[0]['page_size']} tokens each)" if rows else "peak KV pages")
    ax.set_title(title or "Parallel sampling: KV memory with and without sharing")
    ax.legend(fontsize=8, loc="upper left")
    return fig
