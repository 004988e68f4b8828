"""One streaming request to an OpenAI-compatible `/v1/completions`, timed as a client sees it.

The record it fills has the fields `course_lib.sim.metrics` reads (`arrival_time`,
`first_token_time`, `finish_time`, `num_prompt_tokens`, `num_output_tokens`, `finish_reason`),
in seconds since the run started, plus `chunk_times` (one per content chunk: the ITL samples)
and `error`. Output tokens are the server's own count (`usage.completion_tokens`, asked for with
`stream_options.include_usage`); a server that sends no usage gets one token per content chunk
(what vLLM's benchmark assumes).

aiohttp, not httpx: its C HTTP parser costs a few microseconds per chunk, so the client can keep
up with 64 streams of a fast server on one core (httpx took ~80 us a chunk here). The body is
read as it arrives and split into events here (one await per network read, not one per line).
`run_async` runs a coroutine on uvloop where it is installed (the `serve` extra brings it).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class Record:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    status: int | None = None
    text: str = ""
    token_ids: list | None = None
    chunk_times: list = field(default_factory=list)


def completion_payload(model: str | None, prompt, max_tokens: int, ignore_eos: bool = True, temperature: float = 0.0,
                       return_token_ids: bool = False) -> dict:
    """What the load generator sends: streaming, greedy, a fixed answer length (`ignore_eos`, as
    vLLM's and SGLang's benchmarks do), and the server's token count at the end."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if model is not None:
        body["model"] = model
    if return_token_ids:
        body["return_token_ids"] = True
    return body


async def stream_completion(session, url: str, body: dict, record: Record, t0: float, headers=None) -> Record:
    """POST `body` to `url` (streaming) over the aiohttp `session`, timing every chunk into
    `record` (times since `t0`, a `time.perf_counter()` reading)."""
    clock = time.perf_counter
    record.arrival_time = clock() - t0
    usage_tokens = None
    chunks = 0
    texts = []
    ids = [] if body.get("return_token_ids") else None
    try:
        async with session.post(url, json=body, headers=headers) as response:
            record.status = response.status
            if response.status != 200:
                record.error = _error_message(await response.read(), response.status)
                record.finish_reason = "error"
                return record
            async for now, data in _data_lines(response.content, clock, t0):
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    record.error = event["error"].get("message", str(event["error"]))
                    record.finish_reason = "error"
                    continue
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or ():
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    new_ids = choice.get("token_ids")
                    if text or new_ids:
                        if record.first_token_time is None:
                            record.first_token_time = now
                        record.chunk_times.append(now)
                        chunks += 1
                        texts.append(text)
                        if ids is not None and new_ids:
                            ids.extend(new_ids)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
    except Exception as err:  # connection refused, reset, timeout, bad JSON: a failed request
        record.error = f"{type(err).__name__}: {err}"
        record.finish_reason = "error"
    record.finish_time = clock() - t0
    record.text = "".join(texts)
    record.token_ids = ids
    record.num_output_tokens = usage_tokens if usage_tokens is not None else chunks
    if record.first_token_time is None and record.finish_reason != "error":
        # A final chunk with no text (e.g. an answer that is only EOS) is still the first token.
        record.first_token_time = record.finish_time
    if record.finish_reason is None:
        record.finish_reason = "error"
        record.error = record.error or "stream ended without a finish_reason"
    return record


async def _data_lines(content, clock, t0: float):
    """(time since `t0`, payload) for each SSE `data:` line, the time being when its network read came
    in: the body is read as it arrives and split here (one await per read, not one per line)."""
    buffer = b""
    async for data in content.iter_any():
        events = (buffer + data).replace(b"\r\n", b"\n").split(b"\n\n")
        buffer = events.pop()  # an event not finished yet
        now = clock() - t0
        for raw in events:
            for line in raw.split(b"\n"):
                if line.startswith(b"data:"):  # comments, event names, ids: nothing the record needs
                    yield now, line[5:].strip()


def run_async(coroutine):
    """`asyncio.run(coroutine)`, on uvloop's faster event loop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def new_session(timeout_s: float = 600.0, limit: int = 0):
    """An aiohttp session for many concurrent streams (`limit` 0: no cap on connections)."""
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=30.0))


def _error_message(raw: bytes, status: int) -> str:
    try:
        return f"HTTP {status}: {json.loads(raw)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {raw[:200]!r}"
