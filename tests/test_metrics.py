"""Metrics from hand-built timelines equal the hand-computed values."""
import json
from types import SimpleNamespace

import pytest

from course_lib.scheduler.output import StepStats
from course_lib.sim.metrics import (
    format_table,
    goodput,
    kv_over_time,
    kv_waste_frac,
    mean_kv_util,
    percentiles,
    queue_over_time,
    summarize,
    values_of,
)

DESIGN_KEYS = {
    "requests_completed", "requests_failed", "output_tokens", "throughput_tok_s", "ttft_s", "tpot_s",
    "latency_s", "kv_waste_frac", "peak_running", "preemptions", "prefix_hit_rate",
}


def _request(rid, arrival, scheduled, first_token, finish, out, reason="length", prompt=10, cached=0, preempt=0):
    return dict(request_id=rid, arrival_time=arrival, first_scheduled_time=scheduled, first_token_time=first_token,
                finish_time=finish, num_prompt_tokens=prompt, num_output_tokens=out, finish_reason=reason,
                num_preemptions=preempt, num_cached_tokens=cached)


# r0: TTFT 0.5, TPOT (2.5 - 0.5) / (5 - 1) = 0.5, latency 2.5
# r1: TTFT 1.0, TPOT (3.0 - 2.0) / (3 - 1) = 0.5, latency 2.0
# r2: TTFT 0.2, one output token -> no TPOT, latency 0.2
# r3: failed at 3.1 -> counted as failed, excluded from latencies, but its finish ends the makespan
REQUESTS = [
    _request("r0", 0.0, 0.0, 0.5, 2.5, 5, prompt=20, cached=8),
    SimpleNamespace(**_request("r1", 1.0, 1.5, 2.0, 3.0, 3, reason="eos", prompt=10)),  # objects work too
    _request("r2", 2.0, 2.0, 2.2, 2.2, 1, reason="stop", prompt=10),
    _request("r3", 3.0, None, None, 3.1, 0, reason="error", prompt=10),
]


def _step(i, start, end, running, waiting, used, allocated, preempt=0, owners=None):
    return StepStats(step=i, start_time=start, end_time=end, num_running=running, num_waiting=waiting,
                     num_prefill_tokens=0, num_decode_tokens=running, num_padded_tokens=0, context_tokens_read=0,
                     attention_context_tokens=0, kv_tokens_written=running, kv_used_slots=used,
                     kv_allocated_slots=allocated, kv_total_slots=64, num_preemptions=preempt, page_owners=owners)


# durations 1.0, 0.5, 2.0 s; waste 6, 12, 0 slots of 16, 32, 8 allocated
STEPS = [
    _step(0, 0.0, 1.0, running=2, waiting=1, used=10, allocated=16),
    _step(1, 1.0, 1.5, running=3, waiting=0, used=20, allocated=32, preempt=1),
    _step(2, 1.5, 3.5, running=1, waiting=0, used=8, allocated=8),
]


def test_per_request_values():
    assert values_of(REQUESTS, "ttft") == pytest.approx([0.5, 1.0, 0.2])
    assert values_of(REQUESTS, "tpot") == pytest.approx([0.5, 0.5])
    assert values_of(REQUESTS, "latency") == pytest.approx([2.5, 2.0, 0.2])
    with pytest.raises(ValueError, match="ttft"):
        values_of(REQUESTS, "speed")


def test_percentiles_interpolate_linearly():
    # Sorted [0.2, 0.5, 1.0]: p50 is the middle value; p90 sits 0.8 of the way from
    # index 1 to index 2 (position 0.9 x 2 = 1.8): 0.5 + 0.8 x 0.5 = 0.9; p99: 0.5 + 0.98 x 0.5.
    assert percentiles([1.0, 0.2, 0.5]) == pytest.approx({"p50": 0.5, "p90": 0.9, "p99": 0.99})
    assert percentiles([1, 2, 3, 4])["p50"] == 2.5
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_summary_by_hand():
    s = summarize(REQUESTS, STEPS, prefix_queried=10, prefix_hits=4)
    assert DESIGN_KEYS <= set(s)
    assert s["requests_completed"] == 3 and s["requests_failed"] == 1
    assert s["output_tokens"] == 9  # 5 + 3 + 1
    assert s["makespan_s"] == pytest.approx(3.1)  # first arrival 0.0 to last finish 3.1
    assert s["throughput_tok_s"] == pytest.approx(9 / 3.1)
    assert s["requests_per_s"] == pytest.approx(3 / 3.1)
    assert s["goodput_req_s"] == pytest.approx(s["requests_per_s"])  # no SLO given
    assert s["ttft_s"] == pytest.approx({"p50": 0.5, "p90": 0.9, "p99": 0.99})
    assert s["tpot_s"] == pytest.approx({"p50": 0.5, "p90": 0.5, "p99": 0.5})
    # latency sorted [0.2, 2.0, 2.5]: p90 = 2.0 + 0.8 x 0.5 = 2.4, p99 = 2.0 + 0.98 x 0.5 = 2.49
    assert s["latency_s"] == pytest.approx({"p50": 2.0, "p90": 2.4, "p99": 2.49})
    # waste, time-weighted: (6 x 1.0 + 12 x 0.5 + 0 x 2.0) / (16 x 1.0 + 32 x 0.5 + 8 x 2.0) = 12 / 48
    assert s["kv_waste_frac"] == pytest.approx(0.25)
    # utilisation: (10/64 x 1.0 + 20/64 x 0.5 + 8/64 x 2.0) / 3.5 s = 36 / 224
    assert s["mean_kv_util"] == pytest.approx(36 / 224)
    assert s["peak_running"] == 3
    assert s["mean_waiting"] == pytest.approx(1.0 / 3.5)
    assert s["preemptions"] == 1
    assert s["prefix_hit_rate"] == pytest.approx(0.4)
    assert s["cached_token_frac"] == pytest.approx(8 / 50)
    json.dumps(s)  # plain Python numbers only


def test_goodput_under_slos():
    # TTFT <= 0.6 s keeps r0 (0.5) and r2 (0.2), drops r1 (1.0); r3 failed.
    assert goodput(REQUESTS, ttft_slo_s=0.6) == pytest.approx(2 / 3.1)
    # latency <= 2.2 s keeps r1 (2.0) and r2 (0.2)
    assert goodput(REQUESTS, latency_slo_s=2.2) == pytest.approx(2 / 3.1)
    assert goodput(REQUESTS, ttft_slo_s=0.6, latency_slo_s=2.2) == pytest.approx(1 / 3.1)
    assert summarize(REQUESTS, STEPS, ttft_slo_s=0.6)["goodput_req_s"] == pytest.approx(2 / 3.1)


def test_over_time_series():
    kv = kv_over_time(STEPS)
    assert kv["time"].tolist() == [0.0, 1.0, 1.5]
    assert kv["used_frac"].tolist() == pytest.approx([10 / 64, 20 / 64, 8 / 64])
    assert kv["waste_frac"].tolist() == pytest.approx([6 / 64, 12 / 64, 0.0])
    q = queue_over_time(STEPS)
    assert q["running"].tolist() == [2, 3, 1] and q["waiting"].tolist() == [1, 0, 0]


def test_untimed_steps_weigh_equally():
    flat = [_step(i, 0.0, 0.0, 1, 0, used, 16) for i, used in enumerate([16, 8])]
    assert kv_waste_frac(flat) == pytest.approx(8 / 32)
    assert mean_kv_util(flat) == pytest.approx((16 + 8) / 2 / 64)


def test_empty_run_is_json_safe():
    s = summarize([], [])
    assert DESIGN_KEYS <= set(s)
    assert s["requests_completed"] == 0 and s["throughput_tok_s"] == 0.0 and s["kv_waste_frac"] == 0.0
    assert s["ttft_s"] == {"p50": None, "p90": None, "p99": None}
    assert s["prefix_hit_rate"] == 0.0 and s["peak_running"] == 0
    json.dumps(s)


def test_preemptions_fall_back_to_requests_without_steps():
    reqs = [_request("a", 0, 0, 1, 2, 2, preempt=2), _request("b", 0, 0, 1, 2, 2, preempt=1)]
    assert summarize(reqs, [])["preemptions"] == 3


def test_aborted_is_neither_completed_nor_failed():
    s = summarize([_request("a", 0, 0, 1, 2, 2, reason="aborted")], [])
    assert s["requests_completed"] == 0 and s["requests_failed"] == 0 and s["requests_aborted"] == 1


def test_format_table_lines_up_runs():
    table = format_table({"static": summarize(REQUESTS, STEPS), "continuous": summarize([], [])})
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "static", "continuous"]
    assert len({len(line) for line in lines[2:] if line.startswith("TTFT")}) == 1
    assert "TTFT p50 (ms)" in table and "500.0" in table  # 0.5 s
    assert "25.0%" in table  # KV waste
    ttft_row = next(line for line in lines if line.startswith("TTFT p99"))
    assert ttft_row.split()[-1] == "-"  # the empty run has no TTFT


def test_engine_outputs_count_their_token_lists():
    # LLMEngine's RequestOutput carries token lists, not counts.
    out = SimpleNamespace(request_id="x", arrival_time=0.0, first_scheduled_time=0.0, first_token_time=0.1,
                          finish_time=0.5, prompt_token_ids=[5] * 7, token_ids=[9] * 5, finish_reason="eos",
                          num_preemptions=0, num_cached_tokens=0)
    s = summarize([out], [])
    assert s["output_tokens"] == 5 and s["prompt_tokens"] == 7
    assert s["tpot_s"]["p50"] == pytest.approx(0.1)  # (0.5 - 0.1) / (5 - 1)
