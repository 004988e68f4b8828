"""Serving metrics from what the engine recorded: per-request timelines and per-step stats.

Inputs:

- requests: dicts or objects with `arrival_time, first_scheduled_time, first_token_time,
  finish_time, num_prompt_tokens, num_output_tokens, finish_reason, num_preemptions,
  num_cached_tokens` (missing fields read as None / 0; `LLMEngine`'s `RequestOutput`s work
  as they are: token counts come from their `token_ids` / `prompt_token_ids`).
- steps: `course_lib.scheduler.output.StepStats` (or anything with its fields).

Definitions (the usual serving-benchmark ones):

- TTFT = first_token_time - arrival_time: waiting in the queue plus the prefill.
- TPOT = (finish_time - first_token_time) / (num_output_tokens - 1): the mean gap between
  output tokens after the first; only requests with more than one output token have one.
- latency = finish_time - arrival_time (end to end).
- Percentiles use `numpy.percentile` with its default linear interpolation between order
  statistics (p50 of [1, 2, 3, 4] is 2.5).
- Throughput divides by the makespan: first arrival to last finish, all requests.
- cached_token_frac = sum of num_cached_tokens / sum of prompt tokens, all requests: each
  request's prompt tokens served from the prefix cache at its latest admission, at most its
  prompt (`Request.num_cached_tokens`), so the fraction is within [0, 1]. It differs from
  prefix_hit_rate, which counts every admission (a preempted request is looked up again).
- Latency statistics and output tokens count *completed* requests only (finished normally:
  not failed, not aborted); a failed request has no meaningful latency.
- Speculative decoding (`speculation_stats`): spec_acceptance_rate = drafts the target kept /
  draft tokens computed (vLLM's definition); tokens_per_decode_step = tokens a decoding request
  gained per step it ran, over every decode row, drafted or not (1.0 without speculation).
- Step-level means (KV utilisation, waste, queue length) weight each step by its duration,
  so a 40 ms prefill step counts more than a 5 ms decode step; if every step has zero
  duration, steps weigh equally.

Empty inputs give JSON-safe values: percentile dicts hold None (no samples is not "zero
latency"), counts are 0, rates and fractions 0.0.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

PERCENTILES = (50, 90, 99)
FAILED_REASONS = ("fail", "error", "reject")  # prefixes of finish reasons that mean "failed"
ABORTED_REASONS = ("abort", "cancel")


# Counts an engine `RequestOutput` carries as token lists rather than numbers.
_COUNT_FALLBACKS = {"num_output_tokens": "token_ids", "num_prompt_tokens": "prompt_token_ids"}


def record_value(record, name: str, default=None):
    """`record[name]` for a mapping, `record.name` otherwise; `default` when absent or None.

    `num_output_tokens` / `num_prompt_tokens` fall back to the length of `token_ids` /
    `prompt_token_ids`, so `LLMEngine` outputs can be passed as they are.
    """
    value = record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)
    if value is None and name in _COUNT_FALLBACKS:
        tokens = record_value(record, _COUNT_FALLBACKS[name])
        value = None if tokens is None else len(tokens)
    return default if value is None else value


def _reason(record) -> str:
    reason = record_value(record, "finish_reason", "")
    return str(getattr(reason, "value", reason)).lower()  # enums too


def is_failed(record) -> bool:
    return _reason(record).startswith(FAILED_REASONS)


def is_aborted(record) -> bool:
    return _reason(record).startswith(ABORTED_REASONS)


def is_completed(record) -> bool:
    """Finished normally (stop token, length limit, ...): the requests latencies describe."""
    return record_value(record, "finish_time") is not None and not is_failed(record) and not is_aborted(record)


# ---------------------------------------------------------------------------------------------
# Per-request values
# ---------------------------------------------------------------------------------------------


def ttft(record) -> float | None:
    first, arrival = record_value(record, "first_token_time"), record_value(record, "arrival_time")
    return None if first is None or arrival is None else float(first - arrival)


def tpot(record) -> float | None:
    first, finish = record_value(record, "first_token_time"), record_value(record, "finish_time")
    n = record_value(record, "num_output_tokens", 0)
    return None if first is None or finish is None or n < 2 else float((finish - first) / (n - 1))


def latency(record) -> float | None:
    finish, arrival = record_value(record, "finish_time"), record_value(record, "arrival_time")
    return None if finish is None or arrival is None else float(finish - arrival)


_PER_REQUEST = {"ttft": ttft, "tpot": tpot, "latency": latency}


def values_of(requests: Sequence, metric: str) -> list[float]:
    """`metric` ("ttft", "tpot" or "latency") of every completed request that has one."""
    if metric not in _PER_REQUEST:
        raise ValueError(f"unknown per-request metric {metric!r}; use one of {', '.join(_PER_REQUEST)}")
    fn = _PER_REQUEST[metric]
    return [v for v in (fn(r) for r in requests if is_completed(r)) if v is not None]


def percentiles(values: Sequence[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """{"p50": .., "p90": .., "p99": ..}; None for each when there are no values."""
    if len(values) == 0:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(v) for q, v in zip(qs, np.percentile(np.asarray(values, dtype=float), qs))}


def makespan(requests: Sequence) -> float:
    """First arrival to last finish, in seconds (0.0 when either is unknown)."""
    arrivals = [t for t in (record_value(r, "arrival_time") for r in requests) if t is not None]
    finishes = [t for t in (record_value(r, "finish_time") for r in requests) if t is not None]
    if not arrivals or not finishes:
        return 0.0
    return max(0.0, float(max(finishes) - min(arrivals)))


def meets_slo(record, ttft_slo_s=None, tpot_slo_s=None, latency_slo_s=None) -> bool:
    """Completed, and within every target given (a request without a TPOT passes that one)."""
    if not is_completed(record):
        return False
    checks = ((ttft, ttft_slo_s), (tpot, tpot_slo_s), (latency, latency_slo_s))
    for fn, limit in checks:
        value = fn(record)
        if limit is not None and value is not None and value > limit:
            return False
    return True


def goodput(requests: Sequence, ttft_slo_s=None, tpot_slo_s=None, latency_slo_s=None) -> float:
    """Requests per second (over the makespan) that completed within the latency targets."""
    span = makespan(requests)
    good = sum(meets_slo(r, ttft_slo_s, tpot_slo_s, latency_slo_s) for r in requests)
    return good / span if span > 0 else 0.0


def prefix_hit_rate(queried: int, hits: int) -> float:
    """Fraction of prefix-cache lookups (blocks or tokens, as counted) that hit; 0.0 if none."""
    return hits / queried if queried > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Per-step values (time-weighted)
# ---------------------------------------------------------------------------------------------


def step_weights(steps: Sequence) -> np.ndarray:
    """Each step's duration; equal weights when no step has a duration (e.g. untimed runs)."""
    w = np.array([max(0.0, s.end_time - s.start_time) for s in steps], dtype=float)
    return w if w.sum() > 0 else np.ones(len(steps))


def _weighted_mean(values, weights) -> float:
    return float(np.dot(values, weights) / weights.sum()) if len(values) else 0.0


def kv_waste_frac(steps: Sequence) -> float:
    """Allocated-but-unused KV slots over allocated slots, both summed over time."""
    if not steps:
        return 0.0
    w = step_weights(steps)
    allocated = np.dot([s.kv_allocated_slots for s in steps], w)
    waste = np.dot([s.kv_waste_slots for s in steps], w)
    return float(waste / allocated) if allocated > 0 else 0.0


def mean_kv_util(steps: Sequence) -> float:
    """Time-weighted mean of used slots / pool slots: how much of the pool held real tokens."""
    if not steps:
        return 0.0
    used = [s.kv_used_slots / s.kv_total_slots if s.kv_total_slots else 0.0 for s in steps]
    return _weighted_mean(used, step_weights(steps))


def kv_over_time(steps: Sequence) -> dict[str, np.ndarray]:
    """Per step: start time, and used / allocated / waste slots as fractions of the pool."""
    total = np.array([max(1, s.kv_total_slots) for s in steps], dtype=float)
    used = np.array([s.kv_used_slots for s in steps], dtype=float) / total
    allocated = np.array([s.kv_allocated_slots for s in steps], dtype=float) / total
    return {
        "time": np.array([s.start_time for s in steps], dtype=float),
        "used_frac": used,
        "allocated_frac": allocated,
        "waste_frac": allocated - used,
    }


def queue_over_time(steps: Sequence) -> dict[str, np.ndarray]:
    """Per step: start time, running and waiting request counts."""
    return {
        "time": np.array([s.start_time for s in steps], dtype=float),
        "running": np.array([s.num_running for s in steps], dtype=int),
        "waiting": np.array([s.num_waiting for s in steps], dtype=int),
    }


def speculation_stats(steps: Sequence, num_drafts: int = 0) -> dict:
    """Draft tokens computed, drafts kept, their ratio (0.0 without drafts), tokens per drafted
    row-step (1 + kept / `num_drafts`, the drafted rows, which the scheduler counts:
    `SchedulerBase.num_drafts`; 0.0 without) and tokens per decode row-step. A drafted row counts
    1 + k tokens in `num_decode_tokens` (k of them in `num_draft_tokens`), a plain decode 1, so
    the decode rows are the difference of the two."""
    drafts = int(sum(getattr(s, "num_draft_tokens", 0) for s in steps))
    accepted = int(sum(getattr(s, "num_accepted_tokens", 0) for s in steps))
    rows = int(sum(s.num_decode_tokens for s in steps)) - drafts
    return {
        "spec_num_drafts": int(num_drafts),
        "spec_draft_tokens": drafts,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / drafts if drafts else 0.0,
        "tokens_per_drafted_step": 1 + accepted / num_drafts if num_drafts else 0.0,
        "tokens_per_decode_step": (rows + accepted) / rows if rows else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def summarize(
    requests: Sequence,
    steps: Sequence,
    prefix_queried: int = 0,
    prefix_hits: int = 0,
    num_drafts: int = 0,
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    latency_slo_s: float | None = None,
) -> dict:
    """One JSON-safe dict per run: the `simulate --json` keys of DESIGN.md and more.

    `goodput_req_s` applies the SLOs given; with none given it equals `requests_per_s`.
    `preemptions` sums the steps' counts (the requests' counts when there are no steps).
    `num_drafts`: drafted rows (speculative decoding), which the steps do not record.
    """
    completed = [r for r in requests if is_completed(r)]
    span = makespan(requests)
    output_tokens = int(sum(record_value(r, "num_output_tokens", 0) for r in completed))
    prompt_tokens = int(sum(record_value(r, "num_prompt_tokens", 0) for r in requests))
    cached_tokens = int(sum(record_value(r, "num_cached_tokens", 0) for r in requests))
    if steps:
        preemptions = int(sum(s.num_preemptions for s in steps))
    else:
        preemptions = int(sum(record_value(r, "num_preemptions", 0) for r in requests))
    w = step_weights(steps) if steps else np.zeros(0)
    return {
        "requests_completed": len(completed),
        "requests_failed": sum(is_failed(r) for r in requests),
        "requests_aborted": sum(is_aborted(r) for r in requests),
        "requests_unfinished": sum(record_value(r, "finish_time") is None for r in requests),
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "makespan_s": span,
        "throughput_tok_s": output_tokens / span if span > 0 else 0.0,
        "requests_per_s": len(completed) / span if span > 0 else 0.0,
        "goodput_req_s": goodput(requests, ttft_slo_s, tpot_slo_s, latency_slo_s),
        "ttft_s": percentiles(values_of(requests, "ttft")),
        "tpot_s": percentiles(values_of(requests, "tpot")),
        "latency_s": percentiles(values_of(requests, "latency")),
        "kv_waste_frac": kv_waste_frac(steps),
        "mean_kv_util": mean_kv_util(steps),
        "peak_running": int(max((s.num_running for s in steps), default=0)),
        "mean_running": _weighted_mean([s.num_running for s in steps], w),
        "mean_waiting": _weighted_mean([s.num_waiting for s in steps], w),
        "max_waiting": int(max((s.num_waiting for s in steps), default=0)),
        "num_steps": len(steps),
        "preemptions": preemptions,
        "prefix_hit_rate": prefix_hit_rate(prefix_queried, prefix_hits),
        "cached_token_frac": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        **speculation_stats(steps, num_drafts),
    }


# Rows of the comparison table: label, summary key (optionally "key.p99"), unit scale, format.
_TABLE_ROWS = [
    ("completed", "requests_completed", 1, "{:d}"),
    ("failed", "requests_failed", 1, "{:d}"),
    ("throughput (tok/s)", "throughput_tok_s", 1, "{:.1f}"),
    ("requests/s", "requests_per_s", 1, "{:.2f}"),
    ("goodput (req/s)", "goodput_req_s", 1, "{:.2f}"),
    ("TTFT p50 (ms)", "ttft_s.p50", 1e3, "{:.1f}"),
    ("TTFT p99 (ms)", "ttft_s.p99", 1e3, "{:.1f}"),
    ("TPOT p50 (ms)", "tpot_s.p50", 1e3, "{:.2f}"),
    ("TPOT p99 (ms)", "tpot_s.p99", 1e3, "{:.2f}"),
    ("latency p50 (s)", "latency_s.p50", 1, "{:.3f}"),
    ("latency p99 (s)", "latency_s.p99", 1, "{:.3f}"),
    ("KV waste", "kv_waste_frac", 100, "{:.1f}%"),
    ("KV utilisation", "mean_kv_util", 100, "{:.1f}%"),
    ("peak running", "peak_running", 1, "{:d}"),
    ("preemptions", "preemptions", 1, "{:d}"),
    ("prefix hit rate", "prefix_hit_rate", 100, "{:.1f}%"),
]
# Shown only when a run drafted (every other run reads 0% and 1.00).
# The last field: the cell reads "-" for a run that drafted nothing.
_SPEC_ROWS = [
    ("draft acceptance", "spec_acceptance_rate", 100, "{:.1f}%", True),
    ("tokens / drafted step", "tokens_per_drafted_step", 1, "{:.2f}", True),
    ("tokens / decode step", "tokens_per_decode_step", 1, "{:.2f}", False),
]


def _lookup(summary: Mapping, key: str):
    value = summary
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _format_cell(value, scale, fmt) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt.endswith("d}"):
        return fmt.format(int(value))
    return fmt.format(float(value) * scale)


def format_table(summaries: Mapping[str, Mapping]) -> str:
    """A plain-text table: one row per metric, one column per run, for stdout comparisons."""
    names = list(summaries)
    rows = [["metric", *names]]
    drafted = any(_lookup(summaries[n], "spec_draft_tokens") for n in names)
    for label, key, scale, fmt in _TABLE_ROWS:
        rows.append([label, *(_format_cell(_lookup(summaries[n], key), scale, fmt) for n in names)])
    for label, key, scale, fmt, drafts_only in _SPEC_ROWS if drafted else ():
        rows.append([label, *(_format_cell(None if drafts_only and not _lookup(summaries[n], "spec_draft_tokens")
                                           else _lookup(summaries[n], key), scale, fmt) for n in names)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(widths[i]) for i, c in enumerate(row[1:], 1)]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
