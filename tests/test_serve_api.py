"""The OpenAI-compatible server: answers equal the engine's, errors are OpenAI-shaped and name the
limit, a full queue says 429, a client that leaves frees its pages, and the official `openai`
client works against it; the 16-seat server's tests run with speculative decoding on too (n-gram
and draft-model drafters), expecting the answers of the engine without it. Each server runs in a
thread on a free loopback port and is stopped."""
from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.serve.launch import ServerThread  # noqa: E402
from serve_support import in_process, wait_until  # noqa: E402

PROMPTS = ["reverse: 58213", "countdown: 12", "spell: 342", "sort: 93127"]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


# Every test of `server` runs without speculation and with each drafter (course_lib/spec): the answers
# must still be the engine's without it (serve_support.in_process), token for token.
SPECULATION = {"none": {}, "ngram": dict(speculative="ngram", num_speculative_tokens=3),
               "draft": dict(speculative="draft", num_speculative_tokens=3, draft_layers=2)}


@pytest.fixture(scope="module", params=list(SPECULATION), ids=[f"spec={k}" for k in SPECULATION])
def server(tiny, request):
    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=16, **SPECULATION[request.param])), tokenizer) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_server(tiny):
    """A pool of 12 pages (192 tokens, less than the 256-token context) and a queue of 1."""
    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(num_pages=12, max_num_seqs=4)), tokenizer, max_waiting=1) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ------------------------------------------------------------------------------------ answers
@pytest.mark.parametrize("text", PROMPTS)
def test_completion_equals_the_engine_in_process(client, tiny, text):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": text, "max_tokens": 40, "temperature": 0,
                                            "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    expected = in_process(tiny, text, 40)
    assert choice["token_ids"] == expected
    assert choice["text"] == tiny[1].decode(expected)
    assert choice["finish_reason"] == "stop"  # the tiny model ends its answers with EOS
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["usage"]["completion_tokens"] == len(expected)
    assert body["usage"]["prompt_tokens"] == len(tiny[1].encode_prompt(text))


def test_a_speculating_server_drafts_and_keeps_some(client, server):
    """The speculative variants do speculate (else they would only repeat the plain one)."""
    config, scheduler = server.loop.engine.config, server.loop.engine.scheduler
    if config.speculative == "none":
        assert scheduler.drafter is None
        return
    before = (scheduler.num_drafts, scheduler.num_accepted_tokens)
    r = client.post("/v1/completions", json={"prompt": "countdown: 36", "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200, r.text  # (answered after the step that counted its drafts)
    assert scheduler.num_drafts > before[0] and scheduler.num_accepted_tokens > before[1]


def test_streaming_gives_the_same_tokens_then_usage_and_done(client, tiny):
    body = {"prompt": "countdown: 12", "max_tokens": 40, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(in_process(tiny, "countdown: 12", 40))
    chunks = events[:-2]
    ids = [t for e in chunks for t in e["choices"][0]["token_ids"]]
    assert ids == in_process(tiny, "countdown: 12", 40)
    assert "".join(e["choices"][0]["text"] for e in chunks) == "12 11 10 9 8 7 6 5 4 3 2 1 0"
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "stop"
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])


def test_stream_min_tokens_bundles_every_chunk_after_the_first(client, server, tiny):
    body = {"prompt": "countdown: 12", "max_tokens": 40, "temperature": 0, "stream": True, "return_token_ids": True}
    interval = server.state.stream_interval_s
    server.state.stream_min_tokens, server.state.stream_interval_s = 4, 0.0  # tokens decide, not time
    try:
        with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = sse_events(r)[:-1]
    finally:
        server.state.stream_min_tokens, server.state.stream_interval_s = 1, interval
    sizes = [len(e["choices"][0]["token_ids"]) for e in chunks]
    assert [t for e in chunks for t in e["choices"][0]["token_ids"]] == in_process(tiny, "countdown: 12", 40)
    assert sizes[0] >= 1 and all(n >= 4 for n in sizes[1:-1]), sizes  # the first at once, the last whatever is left
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_length_limit_finishes_with_length(client):
    r = client.post("/v1/completions", json={"prompt": "countdown: 40", "max_tokens": 5, "temperature": 0})
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 5


def test_chat_uses_the_last_user_message(client, tiny):
    messages = [{"role": "system", "content": "you solve puzzles"}, {"role": "user", "content": "sort: 1"},
                {"role": "assistant", "content": "1"}, {"role": "user", "content": "reverse: 58213"}]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "31285"}
    with client.stream("POST", "/v1/chat/completions",
                       json={"messages": messages, "temperature": 0, "stream": True}) as s:
        events = sse_events(s)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[0]["object"] == "chat.completion.chunk"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "31285" and events[-2]["choices"][0]["finish_reason"] == "stop"


def test_models_health_and_metrics(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert models["data"][0]["max_model_len"] == 256
    assert client.get("/health").json()["status"] == "ok"
    before = client.get("/metrics").text
    client.post("/v1/completions", json={"prompt": "max: 38152", "max_tokens": 8, "temperature": 0})
    text = client.get("/metrics").text
    for name in ("course_lib_num_requests_running", "course_lib_num_requests_waiting", "course_lib_kv_pages_used",
                 "course_lib_kv_pages_free", "course_lib_preemptions_total",
                 "course_lib_time_to_first_token_seconds_bucket", "course_lib_time_per_output_token_seconds_count"):
        assert name in text, name

    def ttft_count(t):
        line = next(x for x in t.splitlines() if x.startswith("course_lib_time_to_first_token_seconds_count"))
        return float(line.split()[-1])

    assert ttft_count(text) == ttft_count(before) + 1


# ------------------------------------------------------------------------------------ errors
BAD_REQUESTS = [
    ("malformed JSON", b'{"prompt": "reverse: 1",', None, "not valid JSON"),
    ("not an object", b'["reverse: 1"]', None, "JSON object"),
    ("empty prompt", {"prompt": ""}, "prompt", "at least 1 token"),
    ("empty token list", {"prompt": []}, "prompt", "at least 1 token"),
    ("max_tokens 0", {"prompt": "reverse: 1", "max_tokens": 0}, "max_tokens", ">= 1"),
    ("max_tokens not int", {"prompt": "reverse: 1", "max_tokens": "ten"}, "max_tokens", "integer"),
    ("prompt too long for the model", {"prompt": [5] * 300}, "prompt", "max_model_len is 256"),
    ("n over the seats", {"prompt": "reverse: 1", "n": 10_000}, "n", "max_num_seqs"),
    ("logprobs over 20", {"prompt": "reverse: 1", "logprobs": 50}, "logprobs", "in [0, 20]"),
    ("unknown token ids", {"prompt": [5, 4000]}, "prompt", "[0, 47)"),
    ("untokenizable text", {"prompt": "REVERSE"}, "prompt", "not in the tokenizer's vocabulary"),
    ("batched prompts", {"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ("temperature out of range", {"prompt": "a", "temperature": 7}, "temperature", "[0.0, 2.0]"),
    ("too many stop strings", {"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}, "stop", "the limit is 4"),
    ("unknown field", {"prompt": "a", "max_new_tokens": 5}, "max_new_tokens", "unknown field"),
]


@pytest.mark.parametrize("name,body,param,needle", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openai_errors_naming_the_limit(client, name, body, param, needle):
    if isinstance(body, bytes):
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert needle in error["message"], error["message"]


def test_chat_errors(client):
    for body, needle in [({"messages": []}, "non-empty"), ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
                         ({"messages": [{"role": "system", "content": "x"}]}, "user message")]:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_unknown_path_and_method_are_openai_shaped(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_prompt_larger_than_the_pool_names_the_pool(small_server):
    with httpx.Client(base_url=small_server.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": [5] * 100, "max_tokens": 150})
    assert r.status_code == 400
    assert "the whole pool holds 192" in r.json()["error"]["message"]


def test_full_queue_answers_429_with_retry_after_and_harms_no_one(small_server):
    import threading

    loop, url = small_server.loop, small_server.url
    result = {}

    def first_request():
        with httpx.Client(base_url=url, timeout=30) as other:
            result["r"] = other.post("/v1/completions", json={"prompt": "reverse: 123", "max_tokens": 10,
                                                              "temperature": 0})

    with httpx.Client(base_url=url, timeout=30) as c:
        c.post("/dashboard/control", json={"action": "pause"})
        waiting = threading.Thread(target=first_request)
        try:
            waiting.start()
            wait_until(lambda: loop.engine.stats()["num_waiting"] == 1, what="the first request to wait")
            r = c.post("/v1/completions", json={"prompt": "reverse: 45", "max_tokens": 10})
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full" and "--max-waiting" in r.json()["error"]["message"]
        finally:
            c.post("/dashboard/control", json={"action": "resume"})
            waiting.join(30)
    assert result["r"].status_code == 200 and result["r"].json()["choices"][0]["text"] == "321"


def test_client_leaving_mid_stream_frees_its_pages_at_once(server):
    loop = server.loop
    body = json.dumps({"prompt": "countdown: 40", "max_tokens": 200, "ignore_eos": True, "temperature": 0,
                       "stream": True}).encode()
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:  # the headers may come in a packet of their own
        piece = sock.recv(4096)
        assert piece, f"the server closed the stream before its first event: {received!r}"
        received += piece
    # the stream has begun: the request holds pages
    wait_until(lambda: loop.stats["pages_used"] > 0, what="pages in use")
    sock.close()
    wait_until(lambda: loop.stats["num_running"] == 0 and loop.stats["pages_used"] == 0
               and not loop.engine.has_unfinished_requests, what="the aborted request's pages to come back")
    assert loop.engine.pool.num_free_pages == loop.engine.pool.num_pages
    metrics = httpx.get(server.url + "/metrics").text
    assert 'course_lib_requests_finished_total{finish_reason="aborted"}' in metrics


# ------------------------------------------------------------------------------------ real client
def test_the_official_openai_client_works(server, tiny):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30, max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    done = client.completions.create(model="tiny", prompt="reverse: 58213", max_tokens=20, temperature=0)
    assert done.choices[0].text == "31285" and done.usage.completion_tokens == 6
    stream = client.completions.create(model="tiny", prompt="spell: 342", max_tokens=40, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == "three hundred forty two"
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "countdown: 3"}],
                                          temperature=0)
    assert chat.choices[0].message.content == "3 2 1 0"
    pieces = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "sort: 93127"}],
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(pieces)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "12379"
    assert chunks[-1].usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="reverse: 1", max_tokens=0)
    assert "max_tokens must be >= 1" in str(err.value)
    with pytest.raises(openai.NotFoundError):  # an unknown model is a 404, as OpenAI and vLLM answer it
        client.completions.create(model="other", prompt="reverse: 1")


# ------------------------------------------------------------------------------------ dashboard API
def test_dashboard_page_state_and_controls(client, server):
    page = client.get("/dashboard")
    assert page.status_code == 200 and 'id="turnstile"' in page.text and 'id="pool"' in page.text
    assert client.get("/dashboard/app.js").status_code == 200
    state = client.get("/dashboard/state").json()
    for key in ("step", "paused", "admission", "stats", "turnstile", "waiting", "pages", "rolling", "num_seats"):
        assert key in state
    assert len(state["pages"]["owners"]) == state["stats"]["num_pages"]
    try:
        assert client.post("/dashboard/control", json={"action": "pause"}).json()["paused"] is True
        burst = client.post("/dashboard/control", json={"action": "burst", "n": 5}).json()
        assert burst["injected"] == 5
        assert client.get("/dashboard/state").json()["stats"]["num_waiting"] == 5  # paused: nobody ran
        before = client.get("/dashboard/state").json()["step"]
        client.post("/dashboard/control", json={"action": "step"})
        wait_until(lambda: client.get("/dashboard/state").json()["step"] == before + 1, what="one step")
        assert client.get("/dashboard/state").json()["stats"]["num_running"] == 5
        r = client.post("/dashboard/control", json={"action": "admission", "policy": "reserve"})
        assert r.json()["admission"] == "reserve"
        assert server.loop.engine.config.admission == "reserve"
        assert client.post("/dashboard/control", json={"action": "admission", "policy": "nope"}).status_code == 400
        assert client.post("/dashboard/control", json={"action": "explode"}).status_code == 400
        assert client.post("/dashboard/control", json={"action": "burst", "n": 0}).status_code == 400
    finally:
        client.post("/dashboard/control", json={"action": "admission", "policy": "watermark"})
        client.post("/dashboard/control", json={"action": "resume"})
    wait_until(lambda: not server.loop.engine.has_unfinished_requests, what="the burst to finish")
    assert server.loop.stats["pages_used"] == 0
