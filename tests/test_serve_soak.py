"""Soak (bounded, loopback): 1,000 requests from 64 concurrent clients, 10% of which hang up
mid-stream and 10% of which are malformed, against a pool small enough to preempt. A quarter of the
well-formed ones ask for n = 2 or 3 greedy samples (sharing their prompt's pages) and a fifth end at
a stop string. Every well-formed request gets, in every choice, exactly the greedy tokens the engine
gives in process (cut at the stop string, when one appears); every malformed one an OpenAI error;
afterwards no page is leaked and the server still answers. Once without speculative decoding and
once with each drafter (the draft model's run with 400 requests), always expecting the answers of
the engine without it."""
from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

aiohttp = pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

import torch  # noqa: E402

from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny  # noqa: E402
from course_lib.model.tasks import sample_task  # noqa: E402
from course_lib.serve.launch import ServerThread  # noqa: E402

NUM_REQUESTS, CONCURRENCY = 1000, 64
# 40 pages of 16 for 32 seats, admitting greedily: the pool runs out, requests are preempted and recomputed.
CONFIG = dict(num_pages=40, max_num_seqs=32, admission="none")
MALFORMED = [
    b'{"prompt": "reverse: 1"', b"[]", json.dumps({"model": "nope", "prompt": "reverse: 1"}).encode(),
    json.dumps({"prompt": ""}).encode(), json.dumps({"prompt": "reverse: 1", "max_tokens": 0}).encode(),
    json.dumps({"prompt": "reverse: 1", "n": 2, "best_of": 1}).encode(), json.dumps({"prompt": [3, 999]}).encode(),
    json.dumps({"prompt": [5] * 400}).encode(), json.dumps({"prompt": "reverse: 1", "logprobs": 99}).encode(),
]


def make_jobs(tokenizer, seed: int = 0, num_requests: int = NUM_REQUESTS) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(num_requests):
        kind = "good" if i % 10 < 8 else ("leave" if i % 10 == 8 else "bad")
        text, _ = sample_task(rng)
        jobs.append({"kind": kind, "prompt": tokenizer.encode_prompt(text), "max_tokens": rng.randint(2, 10),
                     "stream": rng.random() < 0.5, "bad": MALFORMED[i % len(MALFORMED)],
                     "leave_after": rng.randint(0, 3), "n": rng.choice([1, 1, 1, 1, 1, 1, 2, 3]),
                     "stop": str(rng.randrange(10)) if rng.random() < 0.2 else None})
    rng.shuffle(jobs)
    return jobs


async def run_job(session, url: str, job: dict) -> dict:
    if job["kind"] == "bad":
        async with session.post(url, data=job["bad"], headers={"Content-Type": "application/json"}) as r:
            return {"status": r.status, "body": await r.json()}
    if job["kind"] == "leave":  # a long answer, abandoned after a few lines
        body = {"prompt": job["prompt"], "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
        async with session.post(url, json=body) as r:
            for _ in range(job["leave_after"]):
                await r.content.readline()
            r.close()  # hang up: the server must abort the request and free its pages
        return {"status": r.status}
    body = {"prompt": job["prompt"], "max_tokens": job["max_tokens"], "temperature": 0, "stream": job["stream"],
            "return_token_ids": True, "n": job["n"], "stop": job["stop"]}
    async with session.post(url, json=body) as r:
        if not job["stream"]:
            data = await r.json()
            return {"status": r.status, "choices": [(c["text"], c["token_ids"], c["finish_reason"])
                                                    for c in data["choices"]]}
        texts, ids, finish = {}, {}, {}
        async for line in r.content:
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"][0]
                i = choice["index"]
                texts[i] = texts.get(i, "") + choice["text"]
                ids[i] = ids.get(i, []) + choice["token_ids"]
                finish[i] = choice["finish_reason"] or finish.get(i)
        return {"status": r.status, "choices": [(texts[i], ids[i], finish[i]) for i in sorted(texts)]}


async def soak(url: str, jobs: list[dict]) -> list[dict]:
    results: list = [None] * len(jobs)
    todo = list(range(len(jobs)))[::-1]
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY), timeout=timeout) as session:
        async def worker():
            while todo:
                i = todo.pop()
                results[i] = await run_job(session, url + "/v1/completions", jobs[i])

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return results


# The server's engine without speculation, and with each drafter, and how many requests each run sends;
# the expected answers are always the engine's without speculation, so the speculative runs prove greedy
# parity under load, hang-ups, garbage and n > 1. The draft model drafts by rerunning each sequence
# through its layers (no KV cache of its own): its run sends fewer requests, the same mix.
SPECULATION = {"none": ({}, NUM_REQUESTS),
               "ngram": (dict(speculative="ngram", num_speculative_tokens=3), NUM_REQUESTS),
               "draft": (dict(speculative="draft", num_speculative_tokens=3, draft_layers=2), 400)}


@pytest.mark.slow
@pytest.mark.parametrize("speculation", list(SPECULATION))
def test_soak_thousand_requests_with_hangups_and_garbage(speculation):
    knobs, num_requests = SPECULATION[speculation]
    model, tokenizer = load_tiny(dtype=torch.float64)  # float64: greedy ties cannot flip between batchings
    jobs = make_jobs(tokenizer, num_requests=num_requests)
    kinds = {j["kind"] for j in jobs}
    assert kinds == {"good", "leave", "bad"} and any(j["n"] > 1 for j in jobs if j["kind"] == "good")
    good = [j for j in jobs if j["kind"] == "good"]
    expected = LLMEngine(model, EngineConfig(**CONFIG)).generate(
        [j["prompt"] for j in good], [SamplingParams(max_tokens=j["max_tokens"]) for j in good])

    with ServerThread(LLMEngine(model, EngineConfig(**CONFIG, **knobs)), tokenizer) as srv:
        started = time.monotonic()
        results = asyncio.run(soak(srv.url, jobs))
        elapsed = time.monotonic() - started
        engine = srv.loop.engine
        deadline = time.monotonic() + 30
        while (engine.has_unfinished_requests or srv.loop.stats["pages_used"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        health = asyncio.run(_get(srv.url + "/health"))
        pool_after = (engine.pool.num_free_pages, engine.pool.num_pages)
        engine.pool.check_invariants()
        leftover = len(engine.requests) + len(engine.groups)
        preemptions = srv.loop.stats["num_preemptions"]
        scheduler = engine.scheduler
        drafted = (scheduler.num_drafts, scheduler.num_draft_tokens, scheduler.num_accepted_tokens)

    answers = iter(expected)
    mismatches = []
    for job, result in zip(jobs, results):
        if job["kind"] == "good":
            want = next(answers)
            assert result["status"] == 200, result
            choice = _expected_choice(tokenizer, want, job["stop"])
            if result["choices"] != [choice] * job["n"]:
                mismatches.append((job["prompt"], job["n"], job["stop"], result, choice))
        elif job["kind"] == "bad":
            unknown_model = b'"nope"' in job["bad"]  # a 404, as OpenAI and vLLM answer it
            assert result["status"] == (404 if unknown_model else 400), result
            assert set(result["body"]["error"]) == {"message", "type", "param", "code"}
    assert not mismatches, f"{len(mismatches)} answers differ from in-process, e.g. {mismatches[0]}"
    assert pool_after[0] == pool_after[1], f"pages leaked: {pool_after[1] - pool_after[0]} of {pool_after[1]}"
    assert leftover == 0, f"the engine still holds {leftover} request records"
    assert health == 200
    if speculation != "none":  # it did speculate, and kept some drafts
        assert drafted[0] > 0 and drafted[2] > 0, drafted
    print(f"soak ({speculation}): {num_requests} requests in {elapsed:.1f} s, {preemptions} preemptions; "
          f"drafts, draft tokens, accepted: {drafted}")


def _expected_choice(tokenizer, want, stop: str | None) -> tuple:
    """(text, ids, finish_reason) of the in-process greedy answer, cut at `stop` as the server cuts it."""
    reason = {"eos": "stop"}.get(want.finish_reason, want.finish_reason)
    text = tokenizer.decode(want.token_ids)
    if stop is None or stop not in text:
        return text, want.token_ids, reason
    # the ids run up to the token that completed the stop string (one character a token here)
    ids, seen = [], ""
    for token in want.token_ids:
        ids.append(token)
        seen += tokenizer.decode([token])
        if stop in seen:
            break
    return text[:text.index(stop)], ids, "stop"


async def _get(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return r.status
