"""The server's request fields: every field honoured or refused with an error naming it, never
silently ignored; malformed bodies (deep, huge, non-finite, over the size limit) get OpenAI-shaped
400s / 413s, never a 500 or a buffered body; an unknown model is a 404; stop strings end the answer
with the text cut before them, equal to the in-process engine's answer cut by hand, and a stream
never shows a stop string, nor the beginning of one before it is decided."""
from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.serve.launch import ServerThread  # noqa: E402
from course_lib.serve.request_body import MAX_BODY_BYTES  # noqa: E402
from serve_support import in_process, wait_until  # noqa: E402

INT64_RANGE = "[-9223372036854775808, 9223372036854775807]"


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=16)), tokenizer) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def every_token_a_chunk(server):
    """Each token leaves in a chunk of its own, so a test sees every decision the stream makes."""
    saved = server.state.stream_interval_s, server.state.stream_chunks_per_s
    server.state.stream_interval_s, server.state.stream_chunks_per_s = 0.0, 0.0
    yield
    server.state.stream_interval_s, server.state.stream_chunks_per_s = saved


def error_of(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def post_raw(client, raw: bytes, path: str = "/v1/completions"):
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def sse_chunks(client, body: dict, path: str = "/v1/completions") -> list[dict]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ------------------------------------------------------------------------------------ malformed bodies
def test_deeply_nested_json_is_a_400_naming_the_depth_limit(client):
    deep = b'{"prompt": "reverse: 1", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    assert "64 levels" in error_of(post_raw(client, deep))["message"]
    parses_but_too_deep = {"prompt": "reverse: 1", "stop": json.loads("[" * 100 + "]" * 100)}
    assert "64 levels" in error_of(client.post("/v1/completions", json=parses_but_too_deep))["message"]
    assert "64 levels" in error_of(post_raw(client, b"[" * 50_000))["message"]


@pytest.mark.parametrize("raw,needle", [
    (b'{"prompt": "reverse: 1", "temperature": NaN}', "NaN is not a JSON number"),
    (b'{"prompt": "reverse: 1", "temperature": Infinity}', "Infinity is not a JSON number"),
    (b'{"prompt": "reverse: 1", "top_p": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"prompt": "reverse: 1", "temperature": 1e999}', "too large for a 64-bit float"),
    (b'{"prompt": "reverse: 1", "seed": ' + b"9" * 5000 + b"}", "5000 digits"),
], ids=["nan", "infinity", "minus-infinity", "overflowing-float", "5000-digit-int"])
def test_non_finite_and_absurd_numbers_are_400s(client, raw, needle):
    error = error_of(post_raw(client, raw))
    assert needle in error["message"] and error["code"] == "invalid_json"


@pytest.mark.parametrize("field,value,needle", [
    ("seed", 2 ** 64, INT64_RANGE), ("seed", -2 ** 63 - 1, INT64_RANGE),
    ("top_k", 2 ** 64, "[-1, 9223372036854775807]"), ("max_tokens", 2 ** 64, "max_model_len is 256"), ("stop_token_ids", [2 ** 64], "integers >= 0"),
])
def test_huge_integers_name_the_field_and_its_range(client, field, value, needle):
    error = error_of(client.post("/v1/completions", json={"prompt": "reverse: 1", field: value}))
    assert error["param"] == field and needle in error["message"], error


def test_the_largest_64_bit_seed_is_served(client):
    r = client.post("/v1/completions", json={"prompt": "reverse: 1", "seed": 2 ** 63 - 1, "max_tokens": 4})
    assert r.status_code == 200, r.text


def _send_then_read(server, head: bytes, body_pieces, path: str = "/v1/completions") -> bytes:
    """Send a request's head and some of its body, then read the answer (10 s at most)."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() + head
                     + b"\r\n")
        for piece in body_pieces:
            sock.sendall(piece)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = sock.recv(65536)  # socket.timeout if the server waits for the rest of the body
            if not piece:
                break
            answer += piece
        return answer
    finally:
        sock.close()


def _chunked(total: int, size: int = 64 << 10):
    """A chunked body of `total` bytes, never terminated (the client would go on)."""
    return [b"%x\r\n" % size + b"a" * size + b"\r\n" for _ in range(total // size)]


@pytest.mark.parametrize("path", ["/v1/completions", "/dashboard/control"])
def test_the_body_limit_holds_while_reading(server, path):
    # A declared 300 MiB body is refused before any of it is read (reading it all first took 631 MiB).
    answer = _send_then_read(server, b"Content-Length: 314572800\r\n", [b'{"prompt": "' + b"a" * (64 << 10)], path)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert str(MAX_BODY_BYTES).encode() in body and json.loads(body)["error"]["code"] == "body_too_large"
    # A chunked body (no length declared) is cut off once the bytes read pass the limit.
    answer = _send_then_read(server, b"Transfer-Encoding: chunked\r\n", _chunked(MAX_BODY_BYTES + (128 << 10)), path)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert json.loads(body)["error"]["code"] == "body_too_large"


def test_unknown_model_is_a_404(client):
    for path, body in [("/v1/completions", {"model": "gpt-4", "prompt": "reverse: 1"}),
                       ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})]:
        error = error_of(client.post(path, json=body), status=404)
        assert error["param"] == "model" and error["code"] == "model_not_found" and "'tiny'" in error["message"]


# ------------------------------------------------------------------------------------ nothing silently ignored
NOT_SUPPORTED = [
    ("response_format", {"type": "json_object"}), ("guided_json", {"type": "object"}),
    ("guided_regex", "[0-9]+"), ("guided_choice", ["a", "b"]), ("min_p", 0.1), ("suffix", "!"),
    ("truncate_prompt_tokens", 4), ("prompt_logprobs", 1),
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
]


@pytest.mark.parametrize("field,value", NOT_SUPPORTED, ids=[f"{f}={v!r}"[:40] for f, v in NOT_SUPPORTED])
def test_fields_this_server_does_not_implement_are_refused_by_name(client, field, value):
    for path, body in [("/v1/completions", {"prompt": "reverse: 1"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "reverse: 1"}]})]:
        error = error_of(client.post(path, json={**body, field: value}))
        assert error["param"] == field and error["code"] == "unsupported", error
        assert error["message"].startswith(f"{field} must be "), error["message"]


@pytest.mark.parametrize("field", ["foo", "Prompt", "max_new_tokens", "store"])
def test_unknown_fields_are_refused_by_name(client, field):
    error = error_of(client.post("/v1/completions", json={"prompt": "reverse: 1", field: 1}))
    assert error["param"] == field and f"unknown field {field!r}" in error["message"], error
    assert "not supported by this server" in error["message"]


def test_neutral_values_of_unimplemented_fields_are_served(client, tiny):
    """What clients send as defaults (the openai SDK's `n: null`, a benchmark's zero penalties)
    asks for nothing: the answer is the plain greedy one."""
    neutral = {"n": None, "best_of": 1, "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0,
               "repetition_penalty": 1.0, "min_tokens": 0, "min_p": 0, "skip_special_tokens": True, "echo": False,
               "response_format": {"type": "text"}, "suffix": None, "logprobs": None, "tools": None, "user": "ta-1",
               "stop": None}
    r = client.post("/v1/completions", json={"prompt": "sort: 93127", "max_tokens": 20, "temperature": 0,
                                             "return_token_ids": True, **neutral})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == in_process(tiny, "sort: 93127", 20)
    assert len(r.json()["choices"]) == 1


def test_top_p_zero_is_refused_not_turned_into_one(client):
    error = error_of(client.post("/v1/completions", json={"prompt": "reverse: 1", "top_p": 0}))
    assert error["param"] == "top_p" and "(0.0, 1.0]" in error["message"]


def test_max_tokens_beyond_the_context_is_refused_not_clamped(client, tiny):
    prompt_len = len(tiny[1].encode_prompt("countdown: 12"))  # 15
    room = 256 - prompt_len
    for path, body, name in [
        ("/v1/completions", {"prompt": "countdown: 12", "max_tokens": room + 1}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "countdown: 12"}],
                                  "max_completion_tokens": room + 1}, "max_completion_tokens"),
    ]:
        error = error_of(client.post(path, json=body))
        assert error["param"] == name and error["code"] == "context_length_exceeded"
        assert "max_model_len is 256" in error["message"] and f"at most {room}" in error["message"]
    r = client.post("/v1/completions", json={"prompt": "countdown: 12", "max_tokens": room, "ignore_eos": True,
                                             "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == room  # the whole room, exactly
    error = error_of(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "max_completion_tokens": 6}))
    assert error["param"] == "max_completion_tokens" and "disagree" in error["message"]


def test_stream_options_are_honoured_or_refused(client, tiny):
    error = error_of(client.post("/v1/completions", json={"prompt": "reverse: 1", "stream": True,
                                                         "stream_options": {"include_usage": True, "foo": 1}}))
    assert error["param"] == "stream_options" and "foo" in error["message"]
    chunks = sse_chunks(client, {"prompt": "countdown: 5", "max_tokens": 30, "temperature": 0, "stream": True,
                                 "return_token_ids": True,
                                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    seen = 0
    for chunk in chunks[:-1]:  # GuideLLM's per-chunk usage: the running count of tokens sent so far
        seen += len(chunk["choices"][0]["token_ids"])
        assert chunk["usage"]["completion_tokens"] == seen
        assert chunk["usage"]["prompt_tokens"] == len(tiny[1].encode_prompt("countdown: 5"))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == seen


def test_prompt_forms_benchmark_clients_send(client, tiny):
    want = tiny[1].decode(in_process(tiny, "reverse: 58213", 20))
    r = client.post("/v1/completions", json={"prompt": ["reverse: 58213"], "max_tokens": 20, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want  # AIPerf: a batch of one
    parts = [{"type": "text", "text": "reverse: 58213"}]  # GuideLLM: content as text parts
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}], "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    error = error_of(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": image}]}))
    assert "'image_url' part" in error["message"]
    error = error_of(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x", "tool_calls": []}]}))
    assert "'tool_calls'" in error["message"] and "not supported" in error["message"]


# ------------------------------------------------------------------------------------ stop strings
def expected_stop(tiny, text: str, stops: list[str], max_tokens: int = 60, include: bool = False):
    """The in-process greedy answer cut by hand: (text, token ids, finish_reason)."""
    ids = in_process(tiny, text, max_tokens)
    decode = tiny[1].decode
    full = decode(ids)
    hits = [(full.find(s), s) for s in stops if s in full]
    if not hits:
        return full, ids, "stop" if len(ids) < max_tokens else "length"
    at, stop = min(hits)
    n = next(k for k in range(1, len(ids) + 1) if stop in decode(ids[:k]))  # the token that completes it
    return full[:at + len(stop)] if include else full[:at], ids[:n], "stop"


STOP_CASES = [
    ("countdown: 12", [" 9"]),  # "12 11 10 9 8 ..." -> "12 11 10"
    ("countdown: 12", ["10 9"]),  # spans tokens; its first character "1" turns up (undecided) twice before
    ("countdown: 12", ["5", " 1"]),  # the earliest of several wins
    ("spell: 342", ["forty"]),
    ("reverse: 58213", ["3"]),  # the answer's first character: an empty answer
    ("countdown: 3", ["x", "1 0x"]),  # never completes: the whole answer, ended by EOS
]


@pytest.mark.parametrize("text,stops", STOP_CASES, ids=[f"{t}|{s}" for t, s in STOP_CASES])
def test_stop_strings_cut_the_answer_as_the_engine_gives_it(client, server, tiny, text, stops):
    want_text, want_ids, want_reason = expected_stop(tiny, text, stops)
    body = {"prompt": text, "max_tokens": 60, "temperature": 0, "stop": stops if len(stops) > 1 else stops[0],
            "return_token_ids": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["finish_reason"]) == (want_text, want_ids, want_reason)
    assert r.json()["usage"]["completion_tokens"] == len(want_ids)
    wait_until(lambda: not server.loop.engine.has_unfinished_requests and server.loop.stats["pages_used"] == 0,
               what="the stopped request's pages to come back")


@pytest.mark.parametrize("text,stops", STOP_CASES, ids=[f"{t}|{s}" for t, s in STOP_CASES])
def test_a_stream_never_shows_a_stop_string_nor_an_undecided_beginning(client, tiny, every_token_a_chunk, text,
                                                                      stops):
    want_text, want_ids, want_reason = expected_stop(tiny, text, stops)
    chunks = sse_chunks(client, {"prompt": text, "max_tokens": 60, "temperature": 0, "stop": stops, "stream": True,
                                 "return_token_ids": True})
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == want_text
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == want_ids
    assert chunks[-1]["choices"][0]["finish_reason"] == want_reason
    sent, ids = "", []
    for chunk in chunks[:-1]:  # before the end: all the text decided so far, and only that
        sent += chunk["choices"][0]["text"]
        ids += chunk["choices"][0]["token_ids"]
        so_far = tiny[1].decode(ids)
        assert sent == so_far[:len(so_far) - undecided_tail(so_far, stops)], (sent, so_far, stops)


def undecided_tail(text: str, stops: list[str]) -> int:
    """How much of the end of `text` could still begin a stop string (the stream holds it back)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def test_stop_strings_in_chat_and_with_the_stop_included(client, tiny, every_token_a_chunk):
    want_text, want_ids, _ = expected_stop(tiny, "countdown: 12", [" 9"], include=True)
    assert want_text == "12 11 10 9"
    r = client.post("/v1/completions", json={"prompt": "countdown: 12", "max_tokens": 60, "temperature": 0,
                                             "stop": " 9", "include_stop_str_in_output": True})
    assert r.json()["choices"][0]["text"] == want_text
    chat = {"messages": [{"role": "user", "content": "countdown: 12"}], "temperature": 0, "stop": [" 9"]}
    r = client.post("/v1/chat/completions", json=chat)
    assert r.json()["choices"][0]["message"]["content"] == "12 11 10"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    chunks = sse_chunks(client, {**chat, "stream": True}, "/v1/chat/completions")
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "12 11 10"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stop,needle", [
    (["a", "b", "c", "d", "e"], "the limit is 4"), ("", "1 to 256 characters"), (["x" * 257], "1 to 256 characters"),
    ([1], "a string or a list"), ({"s": 1}, "a string or a list"),
])
def test_bad_stop_values_name_the_limit(client, stop, needle):
    error = error_of(client.post("/v1/completions", json={"prompt": "reverse: 1", "stop": stop}))
    assert error["param"] == "stop" and needle in error["message"], error


def test_the_openai_client_sends_stop_and_n_none(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30, max_retries=0)
    done = client.completions.create(model="tiny", prompt="countdown: 12", max_tokens=40, temperature=0, stop=[" 9"],
                                     n=None)
    assert done.choices[0].text == "12 11 10" and done.choices[0].finish_reason == "stop"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="reverse: 1")
    with pytest.raises(openai.BadRequestError, match="logit_bias"):  # honoured, but only within [-100, 100]
        client.completions.create(model="tiny", prompt="reverse: 1", logit_bias={"5": 1000})


class ByteTokenizer:
    """A byte-level tokenizer (ids are UTF-8 bytes), decoded like a Hugging Face one: a character
    split across tokens decodes to U+FFFD until its last byte arrives."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_stop_strings_with_characters_split_across_tokens():
    from course_lib.serve.stop_strings import AnswerText

    ids = list("héllo wörld".encode())
    stop_at = ids.index("ö".encode()[1]) + 1  # the token that completes "ö"
    for stops, want in [(["ö"], "héllo w"), (["wö", "xyz"], "héllo "), (["ld"], "héllo wör"), (["q"], "héllo wörld")]:
        answer = AnswerText(ByteTokenizer(), stops)
        sent, used = "", []
        for token in ids:  # one token per chunk, as a stream
            text, kept = answer.push([token])
            sent, used = sent + text, used + kept
            assert not any(s in sent for s in stops)
        if not answer.stopped:
            sent += answer.flush()
        assert sent == want, (stops, sent)
        assert len(used) == answer.num_tokens
        if stops == ["ö"]:
            assert used == ids[:stop_at]
