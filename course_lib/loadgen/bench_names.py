"""A load run in the words of `vllm bench serve`: its `--save-result` JSON keys and its printed block.

The numbers are the ones report.py already computes from the client's records, named as vLLM's
benchmark names them, so a student can put our JSON next to vLLM's (or GuideLLM's) and compare:

- TTFT: arrival to the first chunk with content;
- TPOT (time per output token, excluding the first): (last - first token) / (output tokens - 1),
  one value per request (GuideLLM calls this "ITL": the same formula);
- ITL (inter-token latency): every gap between consecutive chunks of a stream, one value per gap
  (with one token per chunk, the gap between consecutive tokens; a chunk carrying k tokens makes
  one gap about k times a token's time, so ITL exceeds TPOT when a server bundles tokens);
- E2EL: arrival to the end of the answer;
- request / output-token / total-token throughput over the run's duration (first request sent to
  the last answer received: `makespan_s`).

docs/metrics.md has the same definitions side by side with the server's /metrics names.
"""
from __future__ import annotations

import numpy as np

from course_lib.sim.metrics import is_completed, record_value, values_of

# vLLM's benchmark: metric key -> (its section header, its short name).
SECTIONS = {"ttft": ("Time to First Token", "TTFT"),
            "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
            "itl": ("Inter-token Latency", "ITL"),
            "e2el": ("End-to-end Latency", "E2EL")}
PERCENTILES = (90, 99)


def _stats_ms(name: str, values_s) -> dict:
    """mean_/median_/std_/p90_/p99_{name}_ms, as vLLM's benchmark writes them (0.0 with no values, as it does)."""
    values = np.asarray(list(values_s), dtype=float) * 1e3
    empty = values.size == 0
    stats = {f"mean_{name}_ms": 0.0 if empty else float(values.mean()),
             f"median_{name}_ms": 0.0 if empty else float(np.median(values)),
             f"std_{name}_ms": 0.0 if empty else float(values.std())}
    for q in PERCENTILES:
        stats[f"p{q}_{name}_ms"] = 0.0 if empty else float(np.percentile(values, q))
    return stats


def bench_serve_keys(records, duration_s: float, itl_values_s) -> dict:
    """The run's numbers under `vllm bench serve`'s JSON keys. `itl_values_s`: every chunk gap of
    every completed request (report.inter_token_latencies)."""
    completed = [r for r in records if is_completed(r)]
    total_input = int(sum(record_value(r, "num_prompt_tokens", 0) for r in completed))
    total_output = int(sum(record_value(r, "num_output_tokens", 0) for r in completed))
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    keys = {
        "duration": duration_s,
        "completed": len(completed),
        "failed": len(records) - len(completed),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(completed)),
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    keys.update(_stats_ms("ttft", values_of(records, "ttft")))
    keys.update(_stats_ms("tpot", values_of(records, "tpot")))
    keys.update(_stats_ms("itl", itl_values_s))
    keys.update(_stats_ms("e2el", values_of(records, "latency")))
    return keys


def format_bench_serve(summary: dict) -> str:
    """The printed block of `vllm bench serve`, from a summary holding `bench_serve_keys`."""
    def line(label, value, fmt="{:<10.2f}"):
        return f"{label:<40} {fmt.format(value)}"

    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             line("Successful requests:", summary["completed"], "{:<10}"),
             line("Failed requests:", summary["failed"], "{:<10}"),
             line("Benchmark duration (s):", summary["duration"]),
             line("Total input tokens:", summary["total_input_tokens"], "{:<10}"),
             line("Total generated tokens:", summary["total_output_tokens"], "{:<10}"),
             line("Request throughput (req/s):", summary["request_throughput"]),
             line("Output token throughput (tok/s):", summary["output_throughput"]),
             line("Total Token throughput (tok/s):", summary["total_token_throughput"])]
    for key, (header, short) in SECTIONS.items():
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(line(f"Mean {short} (ms):", summary[f"mean_{key}_ms"]))
        lines.append(line(f"Median {short} (ms):", summary[f"median_{key}_ms"]))
        lines.append(line(f"P99 {short} (ms):", summary[f"p99_{key}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)
