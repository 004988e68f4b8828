"""Every plot renders headless to PNG, and the dashboard's pure render works with a fake run."""
import matplotlib

matplotlib.use("Agg")  # headless, before anything might pick a GUI backend

import pytest  # noqa: E402

from course_lib.scheduler.output import StepStats  # noqa: E402
from course_lib.sim.metrics import summarize  # noqa: E402
from course_lib.viz import (  # noqa: E402
    bus_vs_turnstile,
    kv_utilisation,
    latency_cdfs,
    load_sweep,
    page_pool_map,
    png_bytes,
    queue_lengths,
    render_dashboard,
    simulation_dashboard,
    timeline,
)
from course_lib.viz.figure import new_figure  # noqa: E402
from course_lib.viz.page_map import FREE, SHARED, owner_matrix  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _requests(n, stagger):
    out = []
    for i in range(n):
        arrival = 0.1 * i
        scheduled = arrival + stagger * i
        out.append(dict(request_id=f"r{i}", arrival_time=arrival, first_scheduled_time=scheduled,
                        first_token_time=scheduled + 0.05, finish_time=scheduled + 0.05 + 0.02 * (i % 5 + 1),
                        num_prompt_tokens=8, num_output_tokens=i % 5 + 2, finish_reason="length",
                        num_preemptions=0, num_cached_tokens=0))
    out.append(dict(request_id="bad", arrival_time=0.3, first_scheduled_time=None, first_token_time=None,
                    finish_time=0.4, num_prompt_tokens=8, num_output_tokens=0, finish_reason="error"))
    return out


def _steps(n=12, num_pages=8, owners=True):
    steps = []
    for i in range(n):
        page_owners = None
        if owners:
            page_owners = [None] * num_pages
            for p in range(min(num_pages, i % num_pages + 1)):
                page_owners[p] = f"r{p % 3}"
            page_owners[-1] = ("r0", "r1")  # a shared prefix page
        steps.append(StepStats(step=i, start_time=0.01 * i, end_time=0.01 * (i + 1), num_running=i % 4 + 1,
                               num_waiting=max(0, 3 - i), num_prefill_tokens=4, num_decode_tokens=2,
                               num_padded_tokens=0, context_tokens_read=40, attention_context_tokens=60,
                               kv_tokens_written=6, kv_used_slots=3 * i, kv_allocated_slots=4 * i,
                               kv_total_slots=num_pages * 4, num_preemptions=0, page_owners=page_owners))
    return steps


def _is_png(fig) -> bool:
    return png_bytes(fig, dpi=40).startswith(PNG_MAGIC)


def test_timeline_and_bus_vs_turnstile():
    assert _is_png(timeline(_requests(45, 0.01), title="t"))  # too many rows to label each
    assert _is_png(timeline([]))
    assert _is_png(bus_vs_turnstile(_requests(8, 0.05), _requests(8, 0.0)))


def test_page_pool_map():
    steps = _steps()
    codes, step_numbers, owners = owner_matrix(steps)
    assert codes.shape == (8, 12) and step_numbers == list(range(12))
    assert owners == ["r0", "r1", "r2"]
    assert codes[-1, 0] == SHARED and codes[1, 0] == FREE and codes[0, 0] == 2
    assert _is_png(page_pool_map(steps))
    thinned, cols, _ = owner_matrix(steps, max_columns=5)
    assert thinned.shape == (8, 5) and cols[0] == 0 and cols[-1] == 11
    with pytest.raises(ValueError, match="page_owners"):
        page_pool_map(_steps(owners=False))


def test_latency_cdfs():
    runs = {"static": _requests(10, 0.05), "continuous": _requests(10, 0.0), "empty": []}
    assert _is_png(latency_cdfs(runs, log_x=True))


def test_load_sweep():
    empty = summarize([], [])
    results = {
        "static": [(4, summarize(_requests(5, 0.05), [])), (1, summarize(_requests(5, 0.0), [])), (8, empty)],
        "continuous": [(1, summarize(_requests(5, 0.0), []))],
    }
    assert _is_png(load_sweep(results, load_label="users"))


def test_kv_utilisation_and_queue():
    steps = _steps(owners=False)
    assert _is_png(kv_utilisation({"paged": steps, "contiguous": steps[:4], "no steps": []}))
    assert _is_png(queue_lengths(steps))


def _fake_run(calls, owners=True):
    def run_fn(**kwargs):
        calls.append(kwargs)
        requests = _requests(kwargs.get("users", 4), 0.01)
        steps = _steps(owners=owners)
        return summarize(requests, steps), steps, requests

    return run_fn


def test_render_dashboard_calls_run_fn_with_the_widget_values():
    calls = []
    values = {"page_size": 16, "rate": 2.5, "kv_tokens": 1024, "admission": "watermark"}
    fig = render_dashboard(values, _fake_run(calls))
    assert calls == [values]
    assert "2.5 req/s" in fig.get_suptitle() and "watermark" in fig.get_suptitle()
    assert _is_png(fig)
    with pytest.raises(ValueError, match="unknown dashboard values"):
        render_dashboard({"pagesize": 16}, _fake_run(calls))


def test_simulation_dashboard_wires_controls_to_render(monkeypatch):
    pytest.importorskip("ipywidgets")
    import course_lib.viz.widgets as widgets_module

    rendered = []

    def cheap_render(values, run_fn):  # the real render is tested above; here only the wiring
        rendered.append(dict(values))
        return new_figure(1, 1)

    monkeypatch.setattr(widgets_module, "render_dashboard", cheap_render)
    box = simulation_dashboard(_fake_run([]), load=3, dpi=20)
    assert rendered == [{"page_size": 16, "users": 3, "kv_tokens": 4096, "admission": "none"}]
    assert bytes(box.children[-1].value).startswith(PNG_MAGIC)
    box.children[1].children[1].value = "reserve"  # the admission toggle re-renders
    assert rendered[-1]["admission"] == "reserve"
    with pytest.raises(ValueError, match="load_kind"):
        simulation_dashboard(_fake_run([]), load_kind="qps")
