"""The page pool at a few moments: each physical page a cell of a grid, coloured by its owner.

Where `page_pool_map` draws every step as one thin column (unreadable once the pool has more than
a few hundred pages), this draws a handful of chosen steps as grids of pages, so one can see a
request's pages scattered over the pool and, a little later, the same cells taken by others.

Input: `StepStats` with `page_owners` (engine run with `EngineConfig(record_page_owners=True)`):
one entry per physical page, None (free), a request id, or a collection of ids (shared).
Each request keeps one colour and one short label (its order of first appearance) in every
panel; white is free, black is shared.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from course_lib.viz.figure import new_figure

_PALETTE = [colormaps["tab20"](i) for i in range(20)]
_MAX_LABELLED_PAGES = 256  # beyond this, the cell labels overprint each other


def _owner(entry):
    if isinstance(entry, (tuple, list, set, frozenset)):
        return "shared" if len(entry) > 1 else next(iter(entry), None)
    return entry


def pick_moments(steps: Sequence, num_moments: int = 4) -> list:
    """`num_moments` steps with page owners, evenly spread over the run (busiest fill first ...
    draining last), skipping steps where the pool is empty."""
    mapped = [s for s in steps if getattr(s, "page_owners", None) is not None
              and any(o is not None for o in s.page_owners)]
    if not mapped:
        raise ValueError("no step has page_owners with a used page; run the engine with "
                         "EngineConfig(record_page_owners=True)")
    if num_moments < 1:
        raise ValueError(f"num_moments must be >= 1, got {num_moments}")
    fractions = [(i + 0.5) / num_moments for i in range(num_moments)]
    picked = sorted({min(len(mapped) - 1, int(f * len(mapped))) for f in fractions})
    return [mapped[i] for i in picked]


def page_grid(steps: Sequence, moments: Sequence | None = None, num_moments: int = 4, columns: int | None = None,
              title: str | None = None) -> Figure:
    """One panel per moment (a `StepStats`, or a step number of `steps`); default: `pick_moments`."""
    by_number = {s.step: s for s in steps}
    if moments is None:
        chosen = pick_moments(steps, num_moments)
    else:
        chosen = [by_number[m] if isinstance(m, int) else m for m in moments]
    num_pages = max(len(s.page_owners) for s in chosen)
    cols = columns or max(4, math.ceil(math.sqrt(num_pages * 2)))
    rows = math.ceil(num_pages / cols)

    labels: dict = {}  # request id -> short label, in order of first appearance over the whole run
    for s in steps:
        for entry in getattr(s, "page_owners", None) or ():
            owner = _owner(entry)
            if owner is not None and owner != "shared":
                labels.setdefault(owner, len(labels))
    colours = ["white", "black"] + [_PALETTE[i % len(_PALETTE)] for i in range(max(1, len(labels)))]
    cmap = ListedColormap(colours)

    fig = new_figure(min(16.0, 3.4 * len(chosen) + 0.6), 0.42 * rows + 1.6)
    axes = fig.subplots(1, len(chosen), squeeze=False)[0]
    for ax, step in zip(axes, chosen):
        codes = np.zeros(rows * cols, dtype=np.int64)
        text = [""] * (rows * cols)
        for page, entry in enumerate(step.page_owners):
            owner = _owner(entry)
            if owner is None:
                continue
            if owner == "shared":
                codes[page] = 1
                continue
            codes[page] = 2 + labels[owner]
            text[page] = str(labels[owner])
        ax.imshow(codes.reshape(rows, cols), cmap=cmap, vmin=-0.5, vmax=len(colours) - 0.5, interpolation="nearest")
        if num_pages <= _MAX_LABELLED_PAGES:
            for page, label in enumerate(text):
                if label:
                    ax.text(page % cols, page // cols, label, ha="center", va="center", fontsize=7)
        ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
        ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
        ax.tick_params(which="both", length=0)
        ax.set_xticks([])
        ax.set_yticks(range(rows), [str(r * cols) for r in range(rows)], fontsize=7)
        used = sum(1 for e in step.page_owners if e is not None)
        owners = {_owner(e) for e in step.page_owners if e is not None} - {"shared"}
        ax.set_title(f"step {step.step}: {used}/{len(step.page_owners)} pages,\n{len(owners)} requests", fontsize=9)
    axes[0].set_ylabel("first page of the row", fontsize=8)
    fig.suptitle(title or "the page pool at a few moments (cell = physical page, label = request, white = free)",
                 fontsize=10)
    return fig
