"""Making figures without pyplot: no global state, safe headless (Agg) and in notebooks."""
from __future__ import annotations

import io

from matplotlib.figure import Figure


def new_figure(width: float = 8.0, height: float = 4.0) -> Figure:
    # Figure() instead of pyplot.figure(): pyplot keeps every figure alive in a global registry
    # (a leak for a widget that redraws), and picks a GUI backend that a headless test lacks.
    return Figure(figsize=(width, height), layout="constrained")


def axes_or_new(ax=None, width: float = 8.0, height: float = 4.0):
    """`(figure, ax)`: the given axes and its figure, or a fresh figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(width, height)
    return fig, fig.add_subplot()


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """The figure rendered as PNG (what a widget displays and a test checks)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
