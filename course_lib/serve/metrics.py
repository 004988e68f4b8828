"""Prometheus metrics (`/metrics`): the engine's state and every finished request's latencies.

Everything lives with the engine's loop (a thread, or the engine process): counters and histograms
are updated as requests finish, and a scrape asks the loop to render the text between steps
(`EngineLoop.control("metrics")`), gauges set from the engine's stats at that moment. Each server
has its own registry, so several servers (tests) live in one process.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

# Bucket edges in seconds: the tiny model on a CPU answers in milliseconds; a loaded server or a
# real model in seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model_name}
        self.running = Gauge("course_lib_num_requests_running", "Requests holding a batch seat", registry=r)
        self.waiting = Gauge("course_lib_num_requests_waiting", "Requests in the waiting queue", registry=r)
        self.pages_used = Gauge("course_lib_kv_pages_used", "KV pages held by requests", registry=r)
        self.pages_free = Gauge("course_lib_kv_pages_free", "KV pages free (blank or cached)", registry=r)
        self.pages_total = Gauge("course_lib_kv_pages_total", "KV pages in the pool", registry=r)
        self.preemptions = Gauge("course_lib_preemptions_total", "Preemptions since the server started",
                                 registry=r)
        self.prefix_queried = Gauge("course_lib_prefix_cache_queried_tokens", "Prompt tokens looked up in the "
                                    "prefix cache", registry=r)
        self.prefix_hits = Gauge("course_lib_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                                 registry=r)
        self.steps = Gauge("course_lib_engine_steps_total", "Engine steps since the server started", registry=r)
        self.requests = Counter("course_lib_requests_finished", "Finished requests, by finish reason",
                                ["finish_reason"], registry=r)
        self.rejections = Counter("course_lib_requests_rejected", "Requests refused before they ran, by reason",
                                  ["reason"], registry=r)
        self.tokens = Counter("course_lib_generation_tokens", "Output tokens of finished requests", registry=r)
        self.ttft = Histogram("course_lib_time_to_first_token_seconds", "Time to first token (engine side)",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("course_lib_time_per_output_token_seconds", "Mean gap between later tokens",
                              buckets=TPOT_BUCKETS, registry=r)
        self.latency = Histogram("course_lib_e2e_request_latency_seconds", "Arrival to last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        info = Gauge("course_lib_model_info", "The served model", list(labels), registry=r)
        info.labels(**labels).set(1)

    # -- the engine's loop -------------------------------------------------------------
    def finished(self, reason, ttft, tpot, latency, num_tokens: int) -> None:
        self.requests.labels(finish_reason=reason or "unknown").inc()
        if reason in ("error", "aborted"):
            return
        self.tokens.inc(num_tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
        if tpot is not None:
            self.tpot.observe(tpot)
        if latency is not None:
            self.latency.observe(latency)

    def aborted(self) -> None:
        self.requests.labels(finish_reason="aborted").inc()

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason=reason).inc()

    # -- scrape ---------------------------------------------------------------------------
    def render(self, stats: dict, num_steps: int) -> bytes:
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.pages_used.set(stats["pages_used"])
        self.pages_free.set(stats["pages_free"])
        self.pages_total.set(stats["num_pages"])
        self.preemptions.set(stats["num_preemptions"])
        self.prefix_queried.set(stats["prefix_queried_tokens"])
        self.prefix_hits.set(stats["prefix_hit_tokens"])
        self.steps.set(num_steps)
        return generate_latest(self.registry)
