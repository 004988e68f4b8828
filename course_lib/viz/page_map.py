"""The page-pool map: which request owns each physical KV page at every step.

Input: a sequence of `StepStats` whose `page_owners` is a list with one entry per physical
page: None for a free page, a request id for an owned page, or a tuple / list / set of ids
for a page shared by several requests (prefix caching). Steps without `page_owners` are
skipped. Image: x = step, y = physical page, colour = owner (the palette repeats after 20
owners, so neighbours in time differ), white = free, black = shared. A line on the right axis
shows the KV waste per step (allocated-but-unused slots / allocated slots).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from course_lib.viz.figure import axes_or_new

FREE, SHARED = 0, 1  # image codes; owners are 2, 3, ...
_PALETTE = [colormaps["tab20"](i) for i in range(20)]


def owner_matrix(steps: Sequence, max_columns: int = 2000) -> tuple[np.ndarray, list, list]:
    """`(codes[page, column], step numbers of the columns, owners in order of first appearance)`.

    Long runs are thinned to at most `max_columns` evenly spaced steps (an image wider than the
    screen shows nothing more).
    """
    mapped = [s for s in steps if getattr(s, "page_owners", None) is not None]
    if not mapped:
        raise ValueError("no step has page_owners; run the engine with page ownership recording on")
    if len(mapped) > max_columns:
        mapped = [mapped[i] for i in np.linspace(0, len(mapped) - 1, max_columns).round().astype(int)]
    num_pages = max(len(s.page_owners) for s in mapped)
    codes = np.full((num_pages, len(mapped)), FREE, dtype=np.int64)
    owner_codes: dict = {}
    for col, step in enumerate(mapped):
        for page, owner in enumerate(step.page_owners):
            if isinstance(owner, (tuple, list, set, frozenset)):
                if len(owner) > 1:
                    codes[page, col] = SHARED
                    continue
                owner = next(iter(owner), None)
            if owner is None:
                continue
            codes[page, col] = owner_codes.setdefault(owner, len(owner_codes) + 2)
    return codes, [s.step for s in mapped], list(owner_codes)


def page_pool_map(steps: Sequence, ax=None, max_columns: int = 2000, title: str | None = None) -> Figure:
    codes, step_numbers, _ = owner_matrix(steps, max_columns)
    fig, ax = axes_or_new(ax, 9.0, 4.5)
    # Cycle the palette over owner codes: code c >= 2 gets palette[(c - 2) % 20].
    num_owners = max(1, int(codes.max()) - 1)
    colours = ["white", "black"] + [_PALETTE[i % len(_PALETTE)] for i in range(num_owners)]
    ax.imshow(
        codes,
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap=ListedColormap(colours),
        vmin=-0.5,
        vmax=len(colours) - 0.5,
        extent=(-0.5, len(step_numbers) - 0.5, -0.5, codes.shape[0] - 0.5),
    )
    ax.set_facecolor("#f0f0f0")
    ax.set_xlabel("step" if len(step_numbers) == len(steps) else "step (thinned)")
    ax.set_ylabel("physical page")
    ticks = np.linspace(0, len(step_numbers) - 1, min(8, len(step_numbers))).round().astype(int)
    ax.set_xticks(ticks, [str(step_numbers[i]) for i in ticks])
    by_step = {s.step: s for s in steps}
    waste = [
        by_step[n].kv_waste_slots / by_step[n].kv_allocated_slots if by_step[n].kv_allocated_slots else 0.0
        for n in step_numbers
    ]
    twin = ax.twinx()
    twin.plot(range(len(step_numbers)), waste, color="crimson", linewidth=1.2, label="KV waste")
    twin.set_ylim(0, 1)
    twin.set_ylabel("waste (unused / allocated slots)", color="crimson")
    twin.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "Page pool: owner of every physical page")
    return fig
