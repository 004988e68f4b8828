"""/metrics speaks vLLM's names (types, labels, meanings) next to the course_lib_* ones, and its numbers
agree with what the clients saw: a request mix (answers cut by max_tokens, by a stop string, a client
that hangs up) against a real `python -m course_lib serve` (engine in its own process), scraped and
parsed with prometheus_client's own text parser. Also: docs/metrics.md's table is the registry's, a
stop string counts as "stop" with the engine in a thread too, and the load report carries
`vllm bench serve`'s keys with TPOT and ITL as that tool defines them."""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
from prometheus_client import CollectorRegistry, Histogram, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.loadgen.bench_names import bench_serve_keys, format_bench_serve  # noqa: E402
from course_lib.loadgen.client import Record  # noqa: E402
from course_lib.loadgen.report import inter_token_latencies, summarize_load  # noqa: E402
from course_lib.serve.launch import ServerProcess, ServerThread  # noqa: E402
from course_lib.serve.metrics import FastHistogram, metrics_table_markdown  # noqa: E402
from serve_support import wait_until  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

# vLLM's names and types (its V1 PrometheusStatLogger), written out here: the test's own spec.
VLLM_TYPES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram", "vllm:request_max_num_generation_tokens": "histogram",
}
# Counted things that must be counters (the course_lib_* ones the issue found declared as gauges included).
COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
            "vllm:generation_tokens", "course_lib_preemptions", "course_lib_engine_steps",
            "course_lib_requests_finished", "course_lib_generation_tokens")
LONG = "countdown: 40"
STOP = {"prompt": "countdown: 12", "stop": " 9"}  # "12 11 10 9 ..." ends before " 9" (test_serve_fields)


class Scrape:
    """One /metrics text, parsed by prometheus_client: families' types, and samples by (name, labels)."""

    def __init__(self, text: str):
        self.types, self.samples = {}, {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name: str, **labels) -> float:
        """The sum over every sample of `name` whose labels include `labels` (KeyError if none)."""
        hits = [v for (n, ls), v in self.samples.items() if n == name and set(labels.items()) <= ls]
        if not hits:
            raise KeyError(f"no sample {name} {labels} in /metrics")
        return sum(hits)


def scrape(client) -> Scrape:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return Scrape(r.text)


@pytest.fixture(scope="module")
def server():
    # 12 pages of 16 tokens for 4 seats: three long answers at once cannot all fit (preemptions).
    with ServerProcess(["--max-num-seqs", "4", "--num-pages", "12", "--prefix-caching"]) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def streamed(base_url: str, body: dict, out: dict, first_token: threading.Event | None = None) -> None:
    """POST a streaming completion; `out` gets the client's view: times, usage, finish reason
    (`first_token` is set when the first text arrives)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out["sent"] = time.perf_counter()
    with httpx.Client(base_url=base_url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                out["usage"] = event["usage"]
            for choice in event.get("choices") or ():
                if choice.get("text") and "first" not in out:
                    out["first"] = time.perf_counter()
                    if first_token is not None:
                        first_token.set()
                if choice.get("finish_reason"):
                    out["reason"] = choice["finish_reason"]
    out["end"] = time.perf_counter()


def idle(client) -> Scrape:
    wait_until(lambda: (lambda s: s.get("vllm:num_requests_running") == s.get("vllm:num_requests_waiting") == 0)(
        scrape(client)), what="the server to go idle")
    return scrape(client)


def delta(before: Scrape, after: Scrape, name: str, **labels) -> float:
    return after.get(name, **labels) - before.get(name, **labels)


def test_vllm_names_have_vllms_types_and_the_served_model_label(client):
    s = scrape(client)
    model = client.get("/v1/models").json()["data"][0]["id"]
    for name, kind in VLLM_TYPES.items():
        assert s.types.get(name) == kind, f"{name}: {s.types.get(name)!r}, vLLM's is {kind}"
    for name in COUNTERS:
        assert s.types.get(name) == "counter", f"{name} is a {s.types.get(name)}, not a counter"
    vllm_samples = [(n, dict(ls)) for n, ls in s.samples if n.startswith("vllm:")]
    assert vllm_samples
    for name, labels in vllm_samples:
        assert labels.get("model_name") == model and labels.get("engine") == "0", (name, labels)
    for reason in ("stop", "length", "abort", "error"):  # every series exists from the start, as in vLLM
        assert s.get("vllm:request_success_total", finished_reason=reason) >= 0
    # as vLLM, the spec-decode counters only where the engine speculates (test_serve_speculative.py)
    assert not [name for name in s.types if name.startswith("vllm:spec_decode")]
    # the course_lib_* names are all still there
    for name in ("course_lib_num_requests_running", "course_lib_kv_pages_used", "course_lib_kv_pages_free",
                 "course_lib_kv_pages_total", "course_lib_preemptions_total", "course_lib_prefix_cache_hit_tokens",
                 "course_lib_prefix_cache_queried_tokens", "course_lib_engine_steps_total",
                 "course_lib_generation_tokens_total", "course_lib_time_to_first_token_seconds_count",
                 "course_lib_time_per_output_token_seconds_count", "course_lib_e2e_request_latency_seconds_count"):
        s.get(name)


def test_answers_cut_by_length_agree_with_the_clients(server, client):
    before = idle(client)
    runs = [{} for _ in range(3)]
    first_token = threading.Event()
    threads = [threading.Thread(target=streamed, args=(server.url, {
        "prompt": p, "max_tokens": 150, "ignore_eos": True, "temperature": 0}, out, first_token))
        for p, out in zip([LONG, LONG, "countdown: 39"], runs)]
    for t in threads:
        t.start()
    # Scrape from the first token on: a request then has up to 149 tokens to go, so a loaded machine
    # cannot spend the whole run before the first scrape (it once did, and no scrape saw one running).
    assert first_token.wait(timeout=120), "no answer started streaming"
    seen_running = 0
    while any(t.is_alive() for t in threads):  # scrapes while they run: both name sets, one moment
        s = scrape(client)
        assert s.get("vllm:num_requests_running") == s.get("course_lib_num_requests_running")
        assert s.get("vllm:num_requests_waiting") == s.get("course_lib_num_requests_waiting")
        used, total = s.get("course_lib_kv_pages_used"), s.get("course_lib_kv_pages_total")
        assert s.get("vllm:kv_cache_usage_perc") == pytest.approx(used / total)
        assert s.get("vllm:gpu_cache_usage_perc") == s.get("vllm:kv_cache_usage_perc")
        seen_running = max(seen_running, s.get("vllm:num_requests_running") + s.get("vllm:num_requests_waiting"))
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert seen_running > 0, "no scrape saw a request running or waiting"
    after = idle(client)
    assert all(r["reason"] == "length" and r["usage"]["completion_tokens"] == 150 for r in runs), runs
    prompt = sum(r["usage"]["prompt_tokens"] for r in runs)
    output = sum(r["usage"]["completion_tokens"] for r in runs)

    assert delta(before, after, "vllm:request_success_total", finished_reason="length") == 3
    assert delta(before, after, "course_lib_requests_finished_total", finish_reason="length") == 3
    assert delta(before, after, "vllm:prompt_tokens_total") == prompt
    assert delta(before, after, "vllm:request_prompt_tokens_sum") == prompt
    for name in ("vllm:generation_tokens_total", "vllm:request_generation_tokens_sum",
                 "course_lib_generation_tokens_total"):
        assert delta(before, after, name) == output, name
    assert delta(before, after, "vllm:request_max_num_generation_tokens_sum") == 3 * 150
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_time_per_output_token_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "course_lib_time_to_first_token_seconds_count", "course_lib_e2e_request_latency_seconds_count"):
        assert delta(before, after, name) == 3, name
    # one ITL sample per token after the first; its old vLLM name carries the same samples
    assert delta(before, after, "vllm:inter_token_latency_seconds_count") == output - 3
    assert delta(before, after, "vllm:time_per_output_token_seconds_sum") == pytest.approx(
        delta(before, after, "vllm:inter_token_latency_seconds_sum"))
    # a request's gaps add up to its decode time
    assert delta(before, after, "vllm:inter_token_latency_seconds_sum") == pytest.approx(
        delta(before, after, "vllm:request_decode_time_seconds_sum"), rel=1e-6)
    # the server's times sit inside the client's
    assert 0 < delta(before, after, "vllm:e2e_request_latency_seconds_sum") <= sum(r["end"] - r["sent"] for r in runs)
    assert 0 < delta(before, after, "vllm:time_to_first_token_seconds_sum") <= sum(r["first"] - r["sent"] for r in runs)
    # what the engine counts itself, under both names
    assert delta(before, after, "vllm:num_preemptions_total") == delta(before, after, "course_lib_preemptions_total")
    assert delta(before, after, "vllm:num_preemptions_total") > 0, "three long answers in 12 pages: no preemption?"
    assert delta(before, after, "vllm:prefix_cache_queries_total") == delta(
        before, after, "course_lib_prefix_cache_queried_tokens") > 0
    assert delta(before, after, "vllm:prefix_cache_hits_total") == delta(
        before, after, "course_lib_prefix_cache_hit_tokens")
    assert delta(before, after, "course_lib_engine_steps_total") >= 150
    assert after.get("vllm:kv_cache_usage_perc") == 0.0


def test_a_stop_string_is_a_finish_with_its_latencies_and_a_hang_up_an_abort(server, client):
    before = idle(client)
    whole = client.post("/v1/completions", json={**STOP, "max_tokens": 150, "ignore_eos": True, "temperature": 0})
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["finish_reason"] == "stop"
    stream = {}
    streamed(server.url, {**STOP, "max_tokens": 150, "ignore_eos": True, "temperature": 0}, stream)
    assert stream["reason"] == "stop"
    body = {"prompt": LONG, "max_tokens": 150, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        hung_prompt = next(json.loads(line[6:])["usage"]["prompt_tokens"] for line in r.iter_lines()
                           if line.startswith("data: ") and '"usage"' in line)
    after = idle(client)
    answered = whole.json()["usage"]["completion_tokens"] + stream["usage"]["completion_tokens"]

    assert delta(before, after, "vllm:request_success_total", finished_reason="stop") == 2
    assert delta(before, after, "vllm:request_success_total", finished_reason="abort") == 1
    assert delta(before, after, "vllm:request_success_total", finished_reason="length") == 0
    assert delta(before, after, "course_lib_requests_finished_total", finish_reason="stop") == 2
    assert delta(before, after, "course_lib_requests_finished_total", finish_reason="aborted") == 1
    # the two stop-string answers are timed like any finished request; the hang-up is not
    for name in ("vllm:e2e_request_latency_seconds_count", "vllm:request_time_per_output_token_seconds_count",
                 "vllm:request_decode_time_seconds_count", "course_lib_time_to_first_token_seconds_count",
                 "course_lib_time_per_output_token_seconds_count", "course_lib_e2e_request_latency_seconds_count"):
        assert delta(before, after, name) == 2, name
    assert delta(before, after, "vllm:time_to_first_token_seconds_count") == 3  # at the first token, as vLLM
    prompts = whole.json()["usage"]["prompt_tokens"] + stream["usage"]["prompt_tokens"] + hung_prompt
    assert delta(before, after, "vllm:prompt_tokens_total") == prompts
    # the engine may run a token or two past a stop string (and the hang-up) before it hears
    generated = delta(before, after, "vllm:generation_tokens_total")
    assert answered + 1 <= generated <= 3 * 150
    stopped = delta(before, after, "vllm:request_generation_tokens_sum")
    assert answered <= stopped <= generated
    assert delta(before, after, "course_lib_generation_tokens_total") == stopped
    assert after.get("vllm:kv_cache_usage_perc") == 0.0 and after.get("course_lib_kv_pages_used") == 0


def test_counters_never_go_down(server, client):
    first = scrape(client)
    client.post("/v1/completions", json={"prompt": "reverse: 123", "max_tokens": 8, "temperature": 0})
    second = idle(client)
    counters = [n for n, t in second.types.items() if t in ("counter", "histogram")]
    checked = 0
    for (name, labels), value in second.samples.items():
        family = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if family in counters and (name, labels) in first.samples and not name.endswith("_created"):
            assert value >= first.samples[(name, labels)], (name, dict(labels))
            checked += 1
    assert checked > 50
    for name in ("vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"):
        buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in second.samples.items()
                          if n == name + "_bucket"))
        assert [v for _, v in buckets] == sorted(v for _, v in buckets), f"{name} buckets not cumulative"
        assert buckets[-1] == (float("inf"), second.get(name + "_count"))


def test_a_stop_string_counts_as_stop_with_the_engine_in_a_thread_too():
    model, tokenizer = load_tiny()
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=4)), tokenizer) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/completions", json={**STOP, "max_tokens": 150, "ignore_eos": True, "temperature": 0})
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        wait_until(lambda: not srv.loop.engine.has_unfinished_requests, what="the stopped request to leave")
        s = scrape(c)
        assert s.get("vllm:request_success_total", finished_reason="stop") == 1
        assert s.get("course_lib_requests_finished_total", finish_reason="aborted") == 0
        assert s.get("vllm:e2e_request_latency_seconds_count") == 1
        assert s.get("course_lib_time_per_output_token_seconds_count") == 1


def test_the_fast_histogram_renders_as_prometheus_clients_own():
    values = [0.0, 0.0004, 0.0005, 0.003, 0.02, 0.02, 7.0, 1e9]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastHistogram({"h_seconds": "doc"}, {"model_name": "m"}, (0.0005, 0.001, 0.02, 5.0), ours)
    reference = Histogram("h_seconds", "doc", ["model_name"], buckets=(0.0005, 0.001, 0.02, 5.0),
                          registry=theirs).labels(model_name="m")
    for v in values:
        fast.observe(v)
        reference.observe(v)

    def samples(registry):
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in text_string_to_metric_families(
            generate_latest(registry).decode()) for s in f.samples if not s.name.endswith("_created")}

    assert samples(ours) == samples(theirs)


def test_the_docs_table_is_the_registrys():
    text = DOC.read_text()
    start, end = "<!-- metrics-table -->\n", "<!-- /metrics-table -->"
    assert text.count(start) == 1 and text.count(end) == 1, f"{DOC.name} must hold one metrics-table block"
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == metrics_table_markdown(), (
        f"{DOC.name}'s table differs from /metrics: paste `python -m course_lib.serve.metrics` between the markers")


# ------------------------------------------------------------------------------ the load report
def record(rid, arrival, chunks, finish, n, prompt=10):
    return Record(rid, prompt, 64, arrival_time=arrival, first_token_time=chunks[0], finish_time=finish,
                  num_output_tokens=n, finish_reason="length", chunk_times=list(chunks))


def test_the_report_names_tpot_and_itl_as_vllm_bench_serve_does():
    # a: 5 tokens, one per chunk, 10 ms apart; b: 5 tokens in two chunks (1, then 4 together, 40 ms later)
    records = [record("a", 0.0, [0.1, 0.11, 0.12, 0.13, 0.14], 0.14, 5),
               record("b", 0.0, [0.2, 0.24], 0.24, 5)]
    keys = bench_serve_keys(records, 0.24, inter_token_latencies(records))
    # TPOT: per request, after the first token: (last - first) / (n - 1) = 10 ms for both
    assert keys["mean_tpot_ms"] == pytest.approx(10.0) and keys["p99_tpot_ms"] == pytest.approx(10.0)
    # ITL: per gap between chunks: four of 10 ms and one of 40 ms (four tokens in one chunk)
    assert keys["mean_itl_ms"] == pytest.approx(16.0) and keys["median_itl_ms"] == pytest.approx(10.0)
    assert keys["mean_ttft_ms"] == pytest.approx(150.0) and keys["mean_e2el_ms"] == pytest.approx(190.0)
    assert keys["completed"] == 2 and keys["failed"] == 0
    assert keys["total_input_tokens"] == 20 and keys["total_output_tokens"] == 10
    assert keys["request_throughput"] == pytest.approx(2 / 0.24)
    assert keys["output_throughput"] == pytest.approx(10 / 0.24)
    assert keys["total_token_throughput"] == pytest.approx(30 / 0.24)
    printed = format_bench_serve(keys)
    for line in ("Successful requests:", "Request throughput (req/s):", "Output token throughput (tok/s):",
                 "Time per Output Token (excl. 1st token)", "Mean TPOT (ms):", "Inter-token Latency",
                 "Mean ITL (ms):", "P99 TTFT (ms):", "End-to-end Latency"):
        assert line in printed, line


def test_a_load_run_against_the_server_has_both_key_sets_and_agrees_with_metrics(server, client):
    from course_lib.loadgen import LoadTarget, run_load
    from course_lib.sim.workload import ClosedLoopUsers, LengthDist

    before = idle(client)
    workload = ClosedLoopUsers(2, 6, LengthDist.uniform(8, 16), LengthDist.uniform(20, 30), seed=3)
    result = run_load(LoadTarget(server.url, model="tiny", max_model_len=256, max_tokens=64), workload,
                      progress=False)
    summary = summarize_load(result)
    after = idle(client)
    assert summary["requests_completed"] == summary["completed"] == 6
    for old in ("ttft_s", "tpot_s", "latency_s", "itl_s", "throughput_tok_s", "requests_per_s"):  # kept
        assert old in summary
    assert summary["request_throughput"] == pytest.approx(summary["requests_per_s"])
    assert summary["output_throughput"] == pytest.approx(summary["throughput_tok_s"])
    assert summary["p99_ttft_ms"] == pytest.approx(summary["ttft_s"]["p99"] * 1e3)
    assert summary["median_tpot_ms"] == pytest.approx(summary["tpot_s"]["p50"] * 1e3)
    assert summary["median_itl_ms"] == pytest.approx(summary["itl_s"]["p50"] * 1e3)
    assert summary["median_e2el_ms"] == pytest.approx(summary["latency_s"]["p50"] * 1e3)
    assert summary["total_output_tokens"] == summary["output_tokens"]
    # the client's token counts are the server's
    assert delta(before, after, "vllm:generation_tokens_total") == summary["total_output_tokens"]
    assert delta(before, after, "vllm:prompt_tokens_total") == summary["total_input_tokens"]
    assert delta(before, after, "vllm:request_success_total") == 6
