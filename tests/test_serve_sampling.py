"""The server's parallel sampling and log-probability fields: `n`, `best_of`, `logprobs` / `top_logprobs`
(completions and chat) and `echo`, each equal to the in-process engine's answer (float64, so batching
cannot flip a sample), streamed choices carrying their `index`, invalid combinations as 400s that name
the field and the limit, and every page back in the pool after each request (hang-ups included)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402

from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny  # noqa: E402
from course_lib.serve.launch import ServerThread  # noqa: E402
from serve_support import wait_until  # noqa: E402

MAX_NUM_SEQS = 16


@pytest.fixture(scope="module")
def tiny():
    return load_tiny(dtype=torch.float64)


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=MAX_NUM_SEQS)), tokenizer) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c
    engine = server.loop.engine
    wait_until(lambda: not engine.has_unfinished_requests and engine.pool.num_free_pages == engine.pool.num_pages,
               what="every page back in the pool")
    engine.pool.check_invariants()


def in_process(tiny, text: str, **params):
    """The engine's own answer (a group output for n / best_of > 1)."""
    model, tokenizer = tiny
    (out,) = LLMEngine(model, EngineConfig(max_num_seqs=MAX_NUM_SEQS)).generate(
        [tokenizer.encode_prompt(text)], SamplingParams(**params))
    return out


def sse_chunks(client, body: dict, path: str = "/v1/completions") -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def error_of(r) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


SAMPLED = dict(prompt="countdown: 7", max_tokens=12, temperature=2.0, seed=11)


def test_n_choices_equal_the_engines_samples(client, tiny):
    want = in_process(tiny, SAMPLED["prompt"], max_tokens=12, temperature=2.0, seed=11, n=4)
    r = client.post("/v1/completions", json={**SAMPLED, "n": 4, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in choices] == [s.token_ids for s in want.samples]
    assert r.json()["usage"]["completion_tokens"] == sum(len(s.token_ids) for s in want.samples)
    # choice 0 is the n = 1 answer with the same seed; choice i the one with seed + i
    alone = client.post("/v1/completions", json={**SAMPLED, "seed": 13, "return_token_ids": True}).json()
    assert alone["choices"][0]["token_ids"] == choices[2]["token_ids"]


def test_streamed_choices_carry_their_index(client, tiny):
    want = in_process(tiny, SAMPLED["prompt"], max_tokens=12, temperature=2.0, seed=11, n=3)
    chunks = sse_chunks(client, {**SAMPLED, "n": 3, "return_token_ids": True})
    ids, reasons = {0: [], 1: [], 2: []}, {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        ids[choice["index"]] += choice["token_ids"]
        if choice["finish_reason"]:
            reasons[choice["index"]] = choice["finish_reason"]
    assert [ids[i] for i in range(3)] == [s.token_ids for s in want.samples]
    assert reasons == {i: {"eos": "stop"}.get(s.finish_reason, s.finish_reason) for i, s in enumerate(want.samples)}
    chat = sse_chunks(client, {"messages": [{"role": "user", "content": "sort: 93127"}], "n": 2, "max_tokens": 4},
                      "/v1/chat/completions")
    roles = [c["choices"][0]["index"] for c in chat if c["choices"][0]["delta"].get("role") == "assistant"]
    assert sorted(roles) == [0, 1], "each chat choice opens with its role"


def test_best_of_returns_the_n_most_likely(client, tiny):
    want = in_process(tiny, SAMPLED["prompt"], max_tokens=12, temperature=2.0, seed=11, n=2, best_of=5)
    r = client.post("/v1/completions", json={**SAMPLED, "n": 2, "best_of": 5, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert [c["token_ids"] for c in r.json()["choices"]] == [s.token_ids for s in want.samples]
    assert [c["logprobs"] for c in r.json()["choices"]] == [None, None], "logprobs were not asked for"


def test_completion_logprobs_in_openais_shape(client, tiny):
    tokenizer = tiny[1]
    want = in_process(tiny, "reverse: 58213", max_tokens=8, logprobs=3)
    r = client.post("/v1/completions", json={"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0,
                                             "logprobs": 3, "return_token_ids": True})
    (choice,) = r.json()["choices"]
    lp = choice["logprobs"]
    assert choice["token_ids"] == want.token_ids
    assert lp["token_logprobs"] == [e[0] for e in want.logprobs]
    texts = [tokenizer.decode([t], skip_special=False) for t in want.token_ids]
    assert lp["tokens"] == texts
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert lp["text_offset"] == offsets
    for top, (chosen, alternatives), token in zip(lp["top_logprobs"], want.logprobs, texts):
        assert top == {tokenizer.decode([t], skip_special=False): v for t, v in alternatives} | {token: chosen}
    streamed = sse_chunks(client, {"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0, "logprobs": 3})
    joined = [v for c in streamed for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert joined == lp["token_logprobs"]
    assert [o for c in streamed for o in c["choices"][0]["logprobs"]["text_offset"]] == offsets


def test_chat_logprobs_in_the_chat_shape(client, tiny):
    want = in_process(tiny, "sort: 93127", max_tokens=5, logprobs=2, n=2)
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "sort: 93127"}],
                                                  "max_tokens": 5, "temperature": 0, "n": 2, "logprobs": True,
                                                  "top_logprobs": 2})
    assert r.status_code == 200, r.text
    for choice, sample in zip(r.json()["choices"], want.samples):
        content = choice["logprobs"]["content"]
        assert [c["logprob"] for c in content] == [e[0] for e in sample.logprobs]
        assert all(len(c["top_logprobs"]) == 2 and c["bytes"] == list(c["token"].encode()) for c in content)
        assert [[t["logprob"] for t in c["top_logprobs"]] for c in content] == \
            [[v for _, v in e[1]] for e in sample.logprobs]
    bare = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "sort: 93127"}],
                                                     "max_tokens": 3, "logprobs": True}).json()
    assert all(c["top_logprobs"] == [] for c in bare["choices"][0]["logprobs"]["content"])


def test_echo_puts_the_prompt_before_the_answer(client, tiny):
    model, tokenizer = tiny
    want = in_process(tiny, "reverse: 58213", max_tokens=8)
    answer = tokenizer.decode(want.token_ids)
    r = client.post("/v1/completions", json={"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0,
                                             "echo": True, "n": 2})
    assert [c["text"] for c in r.json()["choices"]] == ["reverse: 58213" + answer] * 2
    streamed = sse_chunks(client, {"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0, "echo": True})
    assert streamed[0]["choices"][0]["text"].startswith("reverse: 58213")
    assert "".join(c["choices"][0]["text"] for c in streamed) == "reverse: 58213" + answer
    ids = tokenizer.encode_prompt("reverse: 58213")
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0, "echo": True})
    assert r.json()["choices"][0]["text"] == tokenizer.decode(ids) + answer


def test_stop_strings_end_each_choice_on_its_own(client, tiny):
    tokenizer = tiny[1]
    want = in_process(tiny, "countdown: 12", max_tokens=30, n=3)
    text = tokenizer.decode(want.token_ids)
    cut = text[:text.index(" 9")]
    body = {"prompt": "countdown: 12", "max_tokens": 30, "temperature": 0, "n": 3, "stop": " 9"}
    r = client.post("/v1/completions", json=body)
    assert [(c["text"], c["finish_reason"]) for c in r.json()["choices"]] == [(cut, "stop")] * 3
    streamed = sse_chunks(client, body)
    texts = {}
    for c in streamed:
        (choice,) = c["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: cut, 1: cut, 2: cut}


def test_a_client_leaving_mid_stream_frees_every_samples_pages(server, tiny):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": "countdown: 40", "max_tokens": 200, "n": 4,
                                                       "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
    engine = server.loop.engine
    wait_until(lambda: not engine.has_unfinished_requests and engine.pool.num_free_pages == engine.pool.num_pages,
               what="pages back after the hang-up")
    assert not engine.groups and not engine.requests


@pytest.mark.parametrize("path,body,param,needle", [
    ("/v1/completions", {"n": 0}, "n", "n must be >= 1"),
    ("/v1/completions", {"n": True}, "n", "n must be an integer"),
    ("/v1/completions", {"n": MAX_NUM_SEQS + 1}, "n", f"max_num_seqs = {MAX_NUM_SEQS}"),
    ("/v1/completions", {"n": 3, "best_of": 2}, "best_of", "best_of must be >= n (3)"),
    ("/v1/completions", {"best_of": MAX_NUM_SEQS + 1}, "best_of", f"max_num_seqs = {MAX_NUM_SEQS}"),
    ("/v1/completions", {"n": 1, "best_of": 2, "stream": True}, "best_of", "cannot stream"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "logprobs must be in [0, 20]"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "logprobs must be an integer"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo", "echo with logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs", "top_logprobs must be null"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "in [0, 20]"),
    ("/v1/chat/completions", {"echo": True}, "echo", "echo must be false"),
], ids=lambda v: str(v)[:30])
def test_invalid_combinations_are_400s_naming_the_field(client, path, body, param, needle):
    base = {"prompt": "reverse: 1"} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": "reverse: 1"}]}
    error = error_of(client.post(path, json={**base, **body}))
    assert error["param"] == param and needle in error["message"], error


def test_through_the_engine_process_with_the_sharing_metrics():
    """`serve`'s default: the engine in a process of its own (choices, logprobs and finishes cross the
    pipe), and /metrics reports the pages the samples shared and copied."""
    from course_lib.loadgen.scrape import parse_prometheus
    from course_lib.serve.launch import ServerProcess

    model, tokenizer = load_tiny()
    (want,) = LLMEngine(model, EngineConfig()).generate(
        [tokenizer.encode_prompt("reverse: 58213")], SamplingParams(max_tokens=8, n=3, logprobs=1))
    with ServerProcess(["--max-num-seqs", "8"]) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        body = {"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0, "n": 3, "logprobs": 1,
                "return_token_ids": True}
        whole = c.post("/v1/completions", json=body).json()["choices"]
        streamed = sse_chunks(c, body)
        metrics = parse_prometheus(c.get("/metrics").text)
    assert [ch["token_ids"] for ch in whole] == [s.token_ids for s in want.samples]
    assert [ch["logprobs"]["token_logprobs"] for ch in whole] == [[e[0] for e in s.logprobs] for s in want.samples]
    by_index = {}
    for chunk in streamed:
        (ch,) = chunk["choices"]
        by_index.setdefault(ch["index"], []).extend(ch["token_ids"])
    assert [by_index[i] for i in range(3)] == [s.token_ids for s in want.samples]
    # "reverse: 58213" is 16 tokens: one full page of 16, so the first decode of each sample takes a new page
    forked, copied = metrics["course_lib_kv_pages_forked_total"], metrics["course_lib_kv_pages_copied_on_write_total"]
    assert forked == 2 * 2 * 1 and copied == 0, (forked, copied)  # two requests, two forks each, one page
    assert metrics["course_lib_kv_pages_saved_by_sharing"] == 0  # (nothing running at the scrape)
