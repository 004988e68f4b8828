"""Prometheus metrics (`/metrics`): the engine's state and every request's latencies, under two names.

- vLLM's names (`vllm:...`, labels `model_name` and `engine`), with vLLM's types and meanings, so a
  Grafana board or alert built for a vLLM server reads this one unchanged;
- the `course_lib_*` names this server had first (a contract: kept as they were, same labels).

When things are measured follows vLLM's V1 engine: per step, the tokens generated, each request's
first token (TTFT, and its prompt tokens) and the gap since its previous token (ITL); per finished
request, its end-to-end, queue, prefill, decode and per-token times. Counters the engine keeps
itself (preemptions, steps, prefix-cache lookups, speculative drafts and accepted tokens) advance to
the engine's totals at each scrape.

Everything lives with the engine's loop (a thread, or the engine process) and runs on its thread:
counters and histograms are updated between steps, and a scrape asks the loop to render the text
(`EngineLoop.control("metrics")`). No locks, then; and each server has its own registry, so several
servers (tests) live in one process. `python -m course_lib.serve.metrics` prints the table of every
name that docs/metrics.md holds (a test keeps the two equal).
"""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

# Bucket edges in seconds: the tiny model on a CPU answers in milliseconds; a loaded server or a
# real model in seconds (vLLM's own edges start at 10 ms for ITL and 300 ms for e2e: every tiny-model
# sample would fall in the first bucket, and a board's quantiles would say nothing).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
REQUEST_BUCKETS = LATENCY_BUCKETS + (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_GAP_BUCKETS = TPOT_BUCKETS + (2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_COUNT_BUCKETS = tuple(m * 10 ** e for e in range(6) for m in (1, 2, 5)) + (1_000_000,)

ENGINE_INDEX = "0"  # vLLM labels each engine core; this server has one
# The engine's finish reasons in vLLM's words (its FinishReason: stop, length, abort, error).
VLLM_FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "aborted": "abort", "error": "error"}
COURSE_FINISH_REASONS = ("eos", "stop", "length", "aborted", "error")
REJECTION_REASONS = ("queue_full", "invalid")
NO_LATENCIES = ("aborted", "error")  # requests that did not end normally: counted, never timed


class FastHistogram:
    """A histogram for one thread and one label set, exposed under one name or more (vLLM's old name
    next to its new one). `observe` is a bisect and two additions (~0.3 us; prometheus_client's
    takes a lock per bucket, ~1.5 us): it runs for every token of every stream."""

    def __init__(self, docs: dict, labels: dict, buckets, registry):
        self.docs, self.labels = docs, labels
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bound >= value: Prometheus's `le`
        self.sum += value

    def collect(self):
        cumulative, running = [], 0
        for bound, count in zip(self.bounds + [float("inf")], self.counts):
            running += count
            cumulative.append((floatToGoString(bound), running))
        for name, doc in self.docs.items():
            family = HistogramMetricFamily(name, doc, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), cumulative, self.sum)
            yield family

    def describe(self):
        return self.collect()


def speculative_positions(config) -> int:
    """How many draft positions an engine with this EngineConfig counts: its num_speculative_tokens
    when it speculates, else 0 (no spec-decode metrics, as vLLM registers none without a speculative
    config)."""
    return config.num_speculative_tokens if config.speculative != "none" else 0


def speculation_totals(scheduler) -> dict:
    """The scheduler's speculative-decoding counts since the start (SchedulerBase keeps them)."""
    return {"num_drafts": scheduler.num_drafts, "num_draft_tokens": scheduler.num_draft_tokens,
            "num_accepted_tokens": scheduler.num_accepted_tokens,
            "accepted_per_position": list(scheduler.accepted_per_position)}


class ServerMetrics:
    def __init__(self, model_name: str, num_speculative_tokens: int = 0):
        """`num_speculative_tokens`: the engine's draft positions (`speculative_positions`), 0 when it
        does not speculate."""
        self.registry = r = CollectorRegistry()
        self._last_token_at: dict = {}  # request id -> engine time of its latest token (ITL)
        self._seen: dict = {}  # engine totals already added to a counter, by key
        v = {"model_name": model_name, "engine": ENGINE_INDEX}

        def gauge(name, doc):
            return Gauge(name, doc, list(v), registry=r).labels(**v)

        def counter(name, doc):
            return Counter(name, doc, list(v), registry=r).labels(**v)

        def histogram(buckets, **docs):
            return FastHistogram(dict(docs), v, buckets, r)

        # -- vLLM's names ----------------------------------------------------------------------
        self.v_running = gauge("vllm:num_requests_running", "Requests in the running batch (holding a seat).")
        self.v_waiting = gauge("vllm:num_requests_waiting", "Requests in the waiting queue.")
        self.v_kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage: pages held by requests / all pages "
                                                             "(1 means 100 percent).")
        self.v_gpu_cache = gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, under vLLM's older name "
                                                              "(DEPRECATED there: use vllm:kv_cache_usage_perc).")
        self.v_prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.v_prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.v_preemptions = counter("vllm:num_preemptions", "Preemptions since the server started.")
        self.v_prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of requests whose prefill finished "
                                                             "(counted at their first token).")
        self.v_generation_tokens = counter("vllm:generation_tokens", "Tokens generated, counted every step "
                                                                     "(aborted requests' too).")
        success = Counter("vllm:request_success", "Finished requests, by finished_reason (stop: EOS, a stop token "
                          "or a stop string; length; abort; error).", [*v, "finished_reason"], registry=r)
        self.v_success = {reason: success.labels(**v, finished_reason=reason)
                          for reason in dict.fromkeys(VLLM_FINISH_REASONS.values())}
        self.v_ttft = histogram(REQUEST_BUCKETS, **{
            "vllm:time_to_first_token_seconds": "Arrival to first token, observed when the first token is out."})
        self.v_itl = histogram(TOKEN_GAP_BUCKETS, **{
            "vllm:inter_token_latency_seconds": "Gap between a request's consecutive tokens (one sample per "
                                                "step that gives the request tokens after its first: one per "
                                                "token, unless speculation gives several in a step).",
            "vllm:time_per_output_token_seconds": "The same samples as vllm:inter_token_latency_seconds, under "
                                                  "vLLM's older name (DEPRECATED there)."})
        self.v_request_tpot = histogram(TOKEN_GAP_BUCKETS, **{
            "vllm:request_time_per_output_token_seconds": "Per finished request: (last token - first token) / "
                                                          "(output tokens - 1)."})
        self.v_e2e = histogram(REQUEST_BUCKETS, **{
            "vllm:e2e_request_latency_seconds": "Per finished request: arrival to finish."})
        self.v_queue = histogram(REQUEST_BUCKETS, **{
            "vllm:request_queue_time_seconds": "Per finished request: arrival to first scheduled (WAITING)."})
        self.v_inference = histogram(REQUEST_BUCKETS, **{
            "vllm:request_inference_time_seconds": "Per finished request: first scheduled to last token (RUNNING)."})
        self.v_prefill = histogram(REQUEST_BUCKETS, **{
            "vllm:request_prefill_time_seconds": "Per finished request: first scheduled to first token (PREFILL)."})
        self.v_decode = histogram(REQUEST_BUCKETS, **{
            "vllm:request_decode_time_seconds": "Per finished request: first token to last token (DECODE)."})
        self.v_request_prompt = histogram(TOKEN_COUNT_BUCKETS, **{
            "vllm:request_prompt_tokens": "Per finished request: its prompt tokens."})
        self.v_request_generation = histogram(TOKEN_COUNT_BUCKETS, **{
            "vllm:request_generation_tokens": "Per finished request: the tokens generated for it."})
        self.v_request_max_tokens = histogram(TOKEN_COUNT_BUCKETS, **{
            "vllm:request_max_num_generation_tokens": "Per finished request: the most tokens it could have had "
                                                      "(max_tokens)."})
        # Speculative decoding, as vLLM's SpecDecodingProm: registered only when the engine speculates, one
        # per-position series for each of the k positions from the start (label "0" is the first draft).
        # Acceptance rate = accepted / draft tokens; mean tokens per drafted step = 1 + accepted / drafts.
        self.v_spec = None
        if num_speculative_tokens > 0:
            self.v_spec = {
                "num_drafts": counter("vllm:spec_decode_num_drafts", "Drafted rows: a request's last token "
                                      "and its draft tokens checked in one step (--speculative only)."),
                "num_draft_tokens": counter("vllm:spec_decode_num_draft_tokens", "Draft tokens checked by the "
                                            "target model (--speculative only)."),
                "num_accepted_tokens": counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens the target "
                                               "model accepted (--speculative only)."),
            }
            per_position = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by "
                                   "position (0: the first draft after the request's last token; a draft is "
                                   "accepted only when every draft before it is; --speculative only).",
                                   [*v, "position"], registry=r)
            self.v_spec["accepted_per_position"] = [per_position.labels(**v, position=str(i))
                                                    for i in range(num_speculative_tokens)]

        # -- course_lib's names (a contract: names, types and labels as they were) ---------------
        self.running = Gauge("course_lib_num_requests_running", "Requests holding a batch seat", registry=r)
        self.waiting = Gauge("course_lib_num_requests_waiting", "Requests in the waiting queue", registry=r)
        self.pages_used = Gauge("course_lib_kv_pages_used", "KV pages held by requests", registry=r)
        self.pages_free = Gauge("course_lib_kv_pages_free", "KV pages free (blank or cached)", registry=r)
        self.pages_total = Gauge("course_lib_kv_pages_total", "KV pages in the pool", registry=r)
        self.preemptions = Counter("course_lib_preemptions", "Preemptions since the server started", registry=r)
        # Gauges by name since the start (their names lack `_total`, which a counter must carry): the
        # counters of the same numbers are vllm:prefix_cache_queries_total and _hits_total.
        self.prefix_queried = Gauge("course_lib_prefix_cache_queried_tokens", "Prompt tokens looked up in the "
                                    "prefix cache (a running total; the counter is vllm:prefix_cache_queries_total)",
                                    registry=r)
        self.prefix_hits = Gauge("course_lib_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache "
                                 "(a running total; the counter is vllm:prefix_cache_hits_total)", registry=r)
        self.steps = Counter("course_lib_engine_steps", "Engine steps since the server started", registry=r)
        requests = Counter("course_lib_requests_finished", "Finished requests, by finish reason (the engine's: eos, "
                           "stop, length, aborted, error; a stop string is stop)", ["finish_reason"], registry=r)
        self.requests = {reason: requests.labels(finish_reason=reason) for reason in COURSE_FINISH_REASONS}
        rejections = Counter("course_lib_requests_rejected", "Requests refused before they ran, by reason",
                             ["reason"], registry=r)
        self.rejections = {reason: rejections.labels(reason=reason) for reason in REJECTION_REASONS}
        self.tokens = Counter("course_lib_generation_tokens", "Output tokens of finished requests", registry=r)
        self.ttft = Histogram("course_lib_time_to_first_token_seconds", "Time to first token (engine side), "
                              "observed when the request finishes", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("course_lib_time_per_output_token_seconds", "Mean gap between later tokens",
                              buckets=TPOT_BUCKETS, registry=r)
        self.latency = Histogram("course_lib_e2e_request_latency_seconds", "Arrival to last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        # Sharing (the vLLM paper's parallel sampling): what the pool saves by holding pages by reference.
        self.pages_saved = gauge("course_lib_kv_pages_saved_by_sharing", "KV pages the running requests would "
                                 "hold more without sharing: page references minus pages in use (parallel samples' "
                                 "shared prompt pages and prefix-cache hits); times page size = KV slots saved.")
        self.pages_forked = counter("course_lib_kv_pages_forked", "Pages parallel samples (n / best_of > 1) took "
                                    "by reference from their prompt's sample instead of computing their own.")
        self.pages_copied = counter("course_lib_kv_pages_copied_on_write", "Shared pages copied on write: a "
                                    "sample's first write into a partly filled page it shared.")
        info = Gauge("course_lib_model_info", "The served model", ["model_name"], registry=r)
        info.labels(model_name=model_name).set(1)

    # -- the engine's loop ---------------------------------------------------------------------
    def step(self, outputs, now: float) -> None:
        """One step's outputs (`now`: the step's end on the engine's clock): tokens generated, first
        tokens (TTFT, prompt tokens) and the gap since each request's previous token (ITL)."""
        last, itl = self._last_token_at, self.v_itl
        generated = 0
        for out in outputs:
            n = len(out.new_token_ids)
            if not n:
                continue
            generated += n
            rid = out.request_id
            before = last.get(rid)
            if before is None:
                if not out.index:  # a request with n > 1: its prompt once (the other samples share it)
                    self.v_prompt_tokens.inc(len(out.prompt_token_ids))
                if out.first_token_time is not None:
                    self.v_ttft.observe(out.first_token_time - out.arrival_time)
            else:
                itl.observe(now - before)
            last[rid] = now
        if generated:
            self.v_generation_tokens.inc(generated)

    def finished(self, out, reason: str | None = None, max_tokens: int | None = None) -> None:
        """A request ended: `out` its RequestOutput, `reason` the engine's finish reason or the API's
        ("stop" for a stop string, found after the engine produced the token that completes it),
        `max_tokens` its sampling parameter."""
        reason = reason or out.finish_reason or "error"
        last_token = self._last_token_at.pop(out.request_id, None)
        self._count(reason)
        if reason in NO_LATENCIES:
            return
        n = len(out.token_ids)
        arrival, scheduled, first, finish = out.arrival_time, out.first_scheduled_time, out.first_token_time, \
            out.finish_time
        last_token = finish if last_token is None else last_token
        self.tokens.inc(n)
        self.v_request_prompt.observe(len(out.prompt_token_ids))
        self.v_request_generation.observe(n)
        if max_tokens is not None:
            self.v_request_max_tokens.observe(max_tokens)
        if finish is not None:
            self.latency.observe(finish - arrival)
            self.v_e2e.observe(finish - arrival)
        if scheduled is not None:
            self.v_queue.observe(scheduled - arrival)
            if last_token is not None:
                self.v_inference.observe(last_token - scheduled)
        if first is None:
            return
        self.ttft.observe(first - arrival)
        if scheduled is not None:
            self.v_prefill.observe(first - scheduled)
        if last_token is not None:
            self.v_decode.observe(last_token - first)
        if n > 1 and finish is not None:
            self.tpot.observe((finish - first) / (n - 1))
            if last_token is not None:
                self.v_request_tpot.observe((last_token - first) / (n - 1))

    def aborted(self, request_id: str, reason: str = "aborted") -> None:
        """A request ended without its answer (its client left, or an engine error): counted, not timed."""
        self._last_token_at.pop(request_id, None)
        self._count(reason)

    def rejected(self, reason: str) -> None:
        self.rejections[reason].inc()

    def _count(self, reason: str) -> None:
        self.requests.get(reason, self.requests["error"]).inc()
        self.v_success[VLLM_FINISH_REASONS.get(reason, "error")].inc()

    # -- scrape ----------------------------------------------------------------------------------
    def render(self, stats: dict, num_steps: int, speculation: dict | None = None) -> bytes:
        """The text of /metrics: `stats` the engine's (LLMEngine.stats()), `speculation` its scheduler's
        totals (`speculation_totals`), read only when the engine speculates."""
        usage = stats["pages_used"] / stats["num_pages"] if stats["num_pages"] else 0.0
        for running, waiting in ((self.running, self.waiting), (self.v_running, self.v_waiting)):
            running.set(stats["num_running"])
            waiting.set(stats["num_waiting"])
        self.v_kv_usage.set(usage)
        self.v_gpu_cache.set(usage)
        self.pages_used.set(stats["pages_used"])
        self.pages_free.set(stats["pages_free"])
        self.pages_total.set(stats["num_pages"])
        self.prefix_queried.set(stats["prefix_queried_tokens"])
        self.prefix_hits.set(stats["prefix_hit_tokens"])
        self.pages_saved.set(stats.get("kv_pages_saved_by_sharing", 0))
        for counters, total in (((self.preemptions, self.v_preemptions), stats["num_preemptions"]),
                                ((self.steps,), num_steps),
                                ((self.v_prefix_queries,), stats["prefix_queried_tokens"]),
                                ((self.v_prefix_hits,), stats["prefix_hit_tokens"]),
                                ((self.pages_forked,), stats.get("forked_pages", 0)),
                                ((self.pages_copied,), stats.get("copied_pages", 0))):
            self._advance(counters, total)
        if self.v_spec is not None and speculation is not None:
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                self._advance((self.v_spec[key],), speculation[key])
            for counter, total in zip(self.v_spec["accepted_per_position"], speculation["accepted_per_position"]):
                self._advance((counter,), total)
        return generate_latest(self.registry)

    def _advance(self, counters, total) -> None:
        """Bring counters up to an engine total (which only grows; were it ever reset, wait for it)."""
        key = id(counters[0])
        seen = self._seen.get(key, 0)
        if total > seen:
            for counter in counters:
                counter.inc(total - seen)
            self._seen[key] = total


# ------------------------------------------------------------------------------ the table in the docs
def metric_rows(model_name: str = "MODEL") -> list[tuple[str, str, str, str]]:
    """(name as scraped, type, labels, meaning) of every metric, in the order /metrics lists them."""
    rows = []
    for family in ServerMetrics(model_name, num_speculative_tokens=1).registry.collect():  # every name
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = sorted({key for sample in family.samples for key in sample.labels if key != "le"})
        rows.append((name, family.type, ", ".join(labels), family.documentation))
    return rows


def metrics_table_markdown() -> str:
    lines = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for name, kind, labels, doc in metric_rows():
        lines.append(f"| `{name}` | {kind} | {labels} | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(metrics_table_markdown(), end="")
