"""A load run's numbers, in the simulator's words: `course_lib.sim.metrics.summarize` over the
client's records, so the JSON has every key `simulate --json` writes, plus

- `itl_s`: inter-token latency percentiles, the gaps between successive content chunks of a
  stream (a chunk may carry several tokens when the server coalesces: that is what a user sees;
  `vllm bench serve` measures its ITL the same way);
- `goodput_req_s` under the SLO given (`--slo ttft_ms=..,tpot_ms=..`), `requests_meeting_slo`,
  `goodput_frac` and the `slo` itself;
- `peak_running`, `preemptions`, `prefix_hit_rate` from the server's /metrics when it has one;
- the same run under `vllm bench serve`'s JSON keys (`mean_ttft_ms`, `p99_tpot_ms`, `mean_itl_ms`,
  `median_e2el_ms`, `request_throughput`, `output_throughput`, ...: bench_names.py), so our file
  and vLLM's compare key by key. TPOT here is theirs (per request, after the first token); GuideLLM
  calls that number ITL (docs/metrics.md).

Keys a client cannot observe (KV waste and utilisation, queue lengths over time, step counts)
are null rather than a made-up zero.
"""
from __future__ import annotations

from collections import Counter

from course_lib.sim.metrics import is_completed, meets_slo, percentiles, summarize

from .bench_names import bench_serve_keys

UNOBSERVABLE = ("kv_waste_frac", "mean_kv_util", "mean_running", "mean_waiting", "max_waiting", "num_steps")


def parse_slo(text: str | None) -> dict:
    """"ttft_ms=500,tpot_ms=50" -> {"ttft_s": 0.5, "tpot_s": 0.05}; also latency_ms (or _s units)."""
    slo: dict = {}
    if not text:
        return slo
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        metric, _, unit = key.strip().rpartition("_")
        if not sep or metric not in ("ttft", "tpot", "latency") or unit not in ("ms", "s"):
            raise ValueError(f"--slo takes metric_unit=value pairs (ttft_ms, tpot_ms, latency_ms or _s), got {part!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--slo {key}: {value!r} is not a number") from None
        if not number > 0:
            raise ValueError(f"--slo {key} must be > 0, got {number}")
        slo[f"{metric}_s"] = number / 1000.0 if unit == "ms" else number
    return slo


def inter_token_latencies(records) -> list[float]:
    return [b - a for r in records if is_completed(r) for a, b in zip(r.chunk_times, r.chunk_times[1:])]


def summarize_load(result: dict, slo: dict | None = None) -> dict:
    slo = slo or {}
    records = result["records"]
    summary = summarize(records, [], ttft_slo_s=slo.get("ttft_s"), tpot_slo_s=slo.get("tpot_s"),
                        latency_slo_s=slo.get("latency_s"))
    for key in UNOBSERVABLE:
        summary[key] = None
    summary.update(result.get("server") or {})
    good = sum(meets_slo(r, slo.get("ttft_s"), slo.get("tpot_s"), slo.get("latency_s")) for r in records)
    errors = Counter(r.error for r in records if r.error)
    itl = inter_token_latencies(records)
    summary.update(
        itl_s=percentiles(itl),
        slo=slo,
        requests_meeting_slo=good,
        goodput_frac=good / len(records) if records else 0.0,
        requests_total=len(records),
        requests_not_issued=result.get("num_requests", len(records)) - len(records),
        requests_clipped=result.get("clipped", 0),
        sim_time_s=None,  # no simulated clock here: wall_time_s is the run's time
        spec_draft_model_time_s=None,  # ... nor a share of it for a draft model's passes
        wall_time_s=result.get("wall_s", 0.0),
        errors=dict(errors.most_common(5)),
    )
    summary.update(bench_serve_keys(records, summary["makespan_s"], itl))
    return summary
