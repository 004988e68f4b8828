"""The parallel-sampling memory figure (sim/parallel_sampling.py, viz/parallel_sampling.py): peak KV pages
measured on the engine equal the page arithmetic of sharing the prompt's full pages (the partly filled
last one is copied on write), and the plot draws those numbers."""
from __future__ import annotations

import pytest

from course_lib.sim.parallel_sampling import parallel_sampling_memory
from course_lib.viz import parallel_sampling_memory_plot, png_bytes


def expected_pages(n: int, prompt_len: int, output_len: int, page_size: int) -> tuple[int, int]:
    """(shared, unshared) peak pages: a sample's last sampled token has no K/V, hence the - 1."""
    per_sample = -(-(prompt_len + output_len - 1) // page_size)
    full_prompt = prompt_len // page_size
    return full_prompt + n * (per_sample - full_prompt), n * per_sample


@pytest.mark.parametrize("prompt_len,output_len,page_size", [(200, 100, 16), (60, 200, 16), (33, 9, 4), (32, 9, 4)])
def test_peak_pages_are_the_sharing_arithmetic(prompt_len, output_len, page_size):
    rows = parallel_sampling_memory((1, 2, 4, 8), prompt_len, output_len, page_size)
    assert [r["n"] for r in rows] == [1, 2, 4, 8]
    for r in rows:
        shared, unshared = expected_pages(r["n"], prompt_len, output_len, page_size)
        assert (r["shared_pages"], r["unshared_pages"]) == (shared, unshared), r
        assert r["saved_frac"] == pytest.approx(1 - shared / unshared)
    assert rows[0]["saved_frac"] == 0
    saved = [r["saved_frac"] for r in rows]
    assert saved == sorted(saved) and saved[-1] > 0, "sharing saves more with more samples"


def test_the_plot_draws_both_bars_for_every_n():
    rows = parallel_sampling_memory((1, 2, 4, 8), 64, 32, 16)
    fig = parallel_sampling_memory_plot(rows)
    (ax,) = fig.axes
    heights = [round(p.get_height()) for p in ax.patches]
    assert heights == [r["unshared_pages"] for r in rows] + [r["shared_pages"] for r in rows]
    assert [t.get_text() for t in ax.texts] == [f"-{100 * r['saved_frac']:.0f}%" for r in rows[1:]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert png_bytes(fig).startswith(b"\x89PNG")
