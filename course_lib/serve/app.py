"""The HTTP side: an OpenAI-compatible API in front of one EngineLoop.

    POST /v1/completions        prompt (text or token ids) -> text, streamed over SSE or not
    POST /v1/chat/completions   messages -> an assistant message (see protocol.py's chat template)
    GET  /v1/models             the served model's names, its max_model_len and (`root`) its tokenizer
                                folder, as vLLM reports them
    GET  /health                200 while the engine loop runs (with "paused": true while the dashboard
                                has paused it: requests then wait in the queue), 503 otherwise
    GET  /metrics               Prometheus text (course_lib_engine_paused: 1 while paused)
    GET  /dashboard             the live page for lectures (dashboard.py)

A handler parses and validates the body (protocol.py), hands the request to the engine loop, and
waits for the loop's answer: a rejection (400 with the engine's message, 429 when the queue is
full) or ACCEPTED, then token deltas. A streaming handler sends whatever deltas have piled up
as one chunk, so a slow client gets bigger chunks instead of slowing the engine down.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .choices import choice_events, collect_choices
from .engine_loop import ACCEPTED, EngineLoop, RequestStream
from .dashboard import PAUSED_DETAIL, paused_metric
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics, speculative_positions
from .protocol import APIError, error_body, finish_reason, param_of_engine_error, parse_json, parse_request
from .request_body import body_too_large, declared_too_large, limit_body
from .stop_strings import AnswerText
from .sse import DONE, EventStream, frame, wait_for_disconnect


@dataclass
class ServeState:
    """What every handler needs: the loop, the tokenizer and the names and limits it reports."""

    loop: EngineLoop
    tokenizer: object
    model_name: str
    max_model_len: int
    burst_max_tokens: int = 48
    # A stream's chunks go out at most this often (its first token and its end at once): tokens
    # that arrive sooner wait and share the next chunk. Each chunk costs the server ~30 us of Python
    # and a write, about as much as computing a token of the tiny model, so sending every token
    # alone would halve throughput under 64 streams. 0 sends each token as it comes.
    stream_interval_s: float = 0.005
    # ... and, after the first, carry at least this many tokens (or the last ones): when a step takes
    # longer than the interval, time alone never bundles anything. 1: time decides alone.
    stream_min_tokens: int = 1
    # ... and the server as a whole sends at most this many chunks a second: with S streams open, a
    # stream's chunks are at least S / rate seconds apart. One stream gets every token as it comes;
    # 64 streams of a fast engine share 4,000 chunks a second (a chunk each 16 ms, ~60 updates a
    # second: smooth to a reader) instead of spending a core on writes. 0: no cap.
    stream_chunks_per_s: float = 4000.0
    live_streams: int = 0  # streaming responses open now
    # Every name a client may send as `model` (vLLM's --served-model-name, one or more); the first is
    # `model_name`, the one answers carry. Empty: `model_name` alone.
    served_names: tuple = ()
    # Where a Hugging Face tokenizer of the model lies (a folder), shown as `root` in /v1/models as
    # vLLM shows the model's path: benchmark clients load it by path. None: not known.
    root: str | None = None
    # What the dashboard's controls need (dashboard.py's check_control_token); None: nothing (loopback).
    control_token: str | None = None
    # The engine's pause as the dashboard last saw it: an engine process has no other way to say it.
    paused: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: object = field(default_factory=itertools.count)
    _prefix: str = field(default_factory=lambda: os.urandom(3).hex())

    @property
    def names(self) -> tuple:
        return self.served_names or (self.model_name,)

    @property
    def engine_paused(self) -> bool:
        """Paused from the dashboard: read off the loop in this process, else as the dashboard last saw it."""
        return bool(getattr(self.loop, "paused", self.paused))

    def new_id(self, kind: str) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self._prefix}{next(self._ids)}"


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# ------------------------------------------------------------------------------------ rendering
class Renderer:
    """The JSON of one request's chunks and final answer (completion or chat)."""

    def __init__(self, state: ServeState, request_id: str, kind: str, parsed):
        self.kind, self.parsed = kind, parsed
        self.id, self.model, self.created = request_id, state.model_name, int(time.time())
        self.object = "text_completion" if kind == "completion" else "chat.completion.chunk"
        # Everything before the choice, encoded once: chunks are built for every step.
        self.head = (f'{{"id":"{request_id}","object":"{self.object}","created":{self.created},'
                     f'"model":{json.dumps(self.model)},"choices":[')

    def chunk(self, text: str | None, reason: str | None, token_ids=None, first=False, usage=None, index: int = 0,
              logprobs=None) -> bytes:
        """One SSE chunk; `usage` (the running counts) with stream_options.continuous_usage_stats;
        `index` the choice (n > 1), `logprobs` its rendered logprobs (logprobs.py)."""
        if self.kind == "completion" and reason is None and token_ids is None and usage is None and index == 0 \
                and logprobs is None:  # the common chunk: by hand
            return b"data: " + (self.head + '{"index":0,"text":' + json.dumps(text or "")
                                + ',"logprobs":null,"finish_reason":null}]}').encode() + b"\n\n"
        if self.kind == "completion":
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        else:
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        tail = "]}" if usage is None else '],"usage":' + json.dumps(usage) + "}"
        return frame(self.head + json.dumps(choice, separators=(",", ":")) + tail)

    def usage_chunk(self, usage: dict) -> bytes:
        return frame(self.head + '],"usage":' + json.dumps(usage) + "}")

    def full(self, text: str, reason: str | None, usage: dict, token_ids) -> dict:
        return self.full_choices([self.choice(0, text, reason, token_ids)], usage)

    def choice(self, index: int, text: str, reason: str | None, token_ids=None, logprobs=None) -> dict:
        """One choice of a whole (non-streamed) answer."""
        if self.kind == "completion":
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return choice

    def full_choices(self, choices: list[dict], usage: dict) -> dict:
        obj = "text_completion" if self.kind == "completion" else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _engine_error(message: str) -> APIError:
    return APIError(message, status=500, type="server_error", code="engine_error")


# ------------------------------------------------------------------------------------ handlers
async def _admit(state: ServeState, kind: str, request: Request):
    """Parse, validate and hand to the engine. Returns (stream, parsed) once the engine accepted."""
    body = parse_json(await request.body())
    parsed = parse_request(kind, body, state.tokenizer, state.names, state.max_model_len)
    if not state.loop.alive:
        raise APIError("the engine loop is not running", status=503, type="server_error", code="engine_down")
    stream = RequestStream(state.new_id(kind), kind)
    state.loop.add(stream, parsed.prompt_token_ids, parsed.params)
    first = await stream.queue.get()
    if isinstance(first, APIError):
        if first.status == 400:
            first.param = param_of_engine_error(first.message, kind)
        raise first
    assert first is ACCEPTED, first
    return stream, parsed


def make_handler(state: ServeState, kind: str):
    async def handler(request: Request):
        try:
            stream, parsed = await _admit(state, kind, request)
        except APIError as err:
            return error_response(err)
        render = Renderer(state, stream.request_id, kind, parsed)
        several = parsed.params.num_samples > 1 or parsed.logprobs is not None or parsed.echo
        if parsed.stream:
            events = (choice_events if several else _events)(state, stream, parsed, render)
            return EventStream(events, on_disconnect=lambda: _gone(state, stream))
        return await (collect_choices if several else _collect)(state, stream, parsed, render, request.receive)

    return handler


def _gone(state: ServeState, stream: RequestStream) -> None:
    """The client left: abort its request now, and wake its handler if it is waiting."""
    state.loop.abort(stream.request_id)
    stream.put(None)


async def _events(state: ServeState, stream: RequestStream, parsed, render: Renderer):
    answer = AnswerText(state.tokenizer, parsed.stop, parsed.include_stop_str, parsed.params.skip_special_tokens)
    with_ids = parsed.return_token_ids
    num_prompt = len(parsed.prompt_token_ids)

    def running_usage():  # stream_options.continuous_usage_stats: the counts so far in every chunk
        return _usage(num_prompt, answer.num_tokens) if parsed.continuous_usage else None

    finished = False
    sent = None
    state.live_streams += 1
    min_tokens, held = state.stream_min_tokens, []  # held: tokens waiting for company
    # A chat stream opens with a chunk naming the role. It leaves together with the first token's chunk,
    # as vLLM sends it (on the engine's first output), so a client's time to its first chunk is the
    # time to the first token, not to the request's admission.
    opening = render.chunk("", None, [] if with_ids else None, first=True, usage=running_usage()) \
        if stream.kind == "chat" else b""
    try:
        while True:
            items = [await stream.queue.get()]
            if sent is not None and items[0] is not None and not items[0].finished:
                early = sent + stream_interval(state) - time.monotonic()
                if early > 0:
                    await stream.nap(early)
            items += stream.get_nowait_all()  # everything that piled up: one chunk
            if any(item is None for item in items):
                return  # the client has gone
            new_ids = held + [t for d in items for t in d.new_token_ids]
            final = items[-1] if items[-1].finished else None
            if final is None and sent is not None and len(new_ids) < min_tokens:
                held = new_ids
                continue
            held = []
            if final is not None and final.finish_reason == "error":
                finished = True
                yield frame(json.dumps(error_body(final.error or "engine error", "server_error", None,
                                                  "engine_error"))) + DONE
                return
            text, new_ids = answer.push(new_ids) if new_ids else ("", [])
            if answer.stopped:  # a stop string: the answer ends here, and the engine stops working on it
                state.loop.abort(stream.request_id, "stop")
                reason = "stop"
            elif final is None:
                # Every token goes out when it comes, even one that decodes to no text (an EOS under
                # ignore_eos, the first bytes of a character, text held back as the start of a stop
                # string): text "" while its ids advance, as vLLM streams it, so that a client's time to
                # first token is the first token's, not that of the first token with text.
                if text or new_ids:
                    sent = time.monotonic()
                    yield opening + render.chunk(text, None, new_ids if with_ids else None, usage=running_usage())
                    opening = b""
                continue
            else:
                text += answer.flush()
                reason = finish_reason(final.finish_reason)
            finished = True
            # The last chunk, the usage and [DONE] leave in one write (EventStream ends the body with
            # it): a finished stream's client hears it all at once and can send its next request.
            last = render.chunk(text if (text or stream.kind == "completion") else None, reason,
                                new_ids if with_ids else None, usage=running_usage())
            usage = render.usage_chunk(_usage(num_prompt, answer.num_tokens)) if parsed.include_usage else b""
            yield opening + last + usage + DONE
            return
    finally:
        state.live_streams -= 1
        if not finished:
            state.loop.abort(stream.request_id)


def stream_interval(state: ServeState) -> float:
    """The least time between two chunks of one stream now: the fixed interval, or the chunk budget's
    share per stream if that is longer."""
    if state.stream_chunks_per_s <= 0:
        return state.stream_interval_s
    return max(state.stream_interval_s, state.live_streams / state.stream_chunks_per_s)


async def _collect(state: ServeState, stream: RequestStream, parsed, render: Renderer, receive):
    answer = AnswerText(state.tokenizer, parsed.stop, parsed.include_stop_str, parsed.params.skip_special_tokens)

    async def gather():
        ids, pieces = [], []
        while True:
            delta = await stream.queue.get()
            if delta is None:
                return None
            if parsed.stop:  # decoded as it comes, to stop the engine at the first stop string
                text, used = answer.push(delta.new_token_ids)
                ids += used
                pieces.append(text)
                if answer.stopped:
                    state.loop.abort(stream.request_id, "stop")
                    return ids, "".join(pieces), "stop"
            else:  # decoded once at the end (a Hugging Face decoder re-decodes the whole answer per push)
                ids += delta.new_token_ids
            if delta.finished:
                if delta.finish_reason == "error":
                    return ids, delta.error or "engine error", "error"
                text = "".join(pieces) + answer.flush() if parsed.stop else answer.push(ids)[0]
                return ids, text, finish_reason(delta.finish_reason)

    collector = asyncio.ensure_future(gather())
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    done, _ = await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if collector not in done:  # the client left before its answer
        collector.cancel()
        state.loop.abort(stream.request_id)
        return Response(status_code=499)
    watcher.cancel()
    result = collector.result()
    if result is None:
        return Response(status_code=499)
    ids, text, reason = result
    if reason == "error":
        return error_response(_engine_error(text))
    body = render.full(text, reason, _usage(len(parsed.prompt_token_ids), len(ids)),
                       ids if parsed.return_token_ids else None)
    return JSONResponse(body)


# ------------------------------------------------------------------------------------ the rest
class HotPaths:
    """The two generation endpoints skip Starlette's middleware stack, which wraps `send` twice
    for every chunk of every stream (~7% of the server's time under 64 streams); every other
    path, and any other method on these, goes through Starlette as usual.

    Every HTTP request's body is limited here, while it is read (request_body.py): a declared
    length over the limit is answered at once, without reading a byte of the body; bytes past the
    limit raise the 413 APIError from `receive`, which the handlers answer."""

    def __init__(self, app: Starlette, handlers: dict):
        self.app, self.handlers = app, handlers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if declared_too_large(scope):
            return await error_response(body_too_large())(scope, receive, send)
        receive = limit_body(receive)
        handler = self.handlers.get(scope.get("path"))
        if handler is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        try:
            response = await handler(Request(scope, receive))
        except Exception as exc:  # never a crash: an OpenAI-style 500
            response = JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                                    status_code=500)
        await response(scope, receive, send)


def make_app(state: ServeState, dashboard: bool = True):
    async def models(request):  # one card per served name, as vLLM lists them
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": state.created, "owned_by": "course_lib", "root": state.root,
            "parent": None, "max_model_len": state.max_model_len} for name in state.names]})

    async def health(request):
        if state.loop.alive:  # paused is alive: a probe must not restart a server the instructor paused
            paused = state.engine_paused
            return JSONResponse({"status": "ok", "paused": paused, "steps": state.loop.num_steps,
                                 "engine_busy_s": round(state.loop.busy_s, 3),
                                 **({"detail": PAUSED_DETAIL} if paused else {})})
        return JSONResponse(error_body("the engine loop is not running", "server_error", None, "engine_down"),
                            status_code=503)

    async def metrics(request):
        if not state.loop.alive:
            return error_response(APIError("the engine loop is not running", status=503, type="server_error",
                                           code="engine_down"))
        text = await state.loop.ask("metrics")  # rendered where the engine's counters live
        if text is None:
            return error_response(APIError("metrics are off", status=404, code="not_found"))
        return Response(text + paused_metric(state.model_name, state.engine_paused), media_type=CONTENT_TYPE_LATEST)

    hot = {"/v1/completions": make_handler(state, "completion"),
           "/v1/chat/completions": make_handler(state, "chat")}
    routes = [
        Route("/v1/completions", hot["/v1/completions"], methods=["POST"]),
        Route("/v1/chat/completions", hot["/v1/chat/completions"], methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    if dashboard:
        from .dashboard import dashboard_routes

        routes += dashboard_routes(state)

    async def http_error(request, exc: HTTPException):
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", kind, None,
                                       str(exc.status_code)), status_code=exc.status_code)

    async def server_error(request, exc: Exception):
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

    async def api_error(request, exc: APIError):  # e.g. a dashboard control's body over the limit
        return error_response(exc)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, APIError: api_error,
                                                       Exception: server_error})
    return HotPaths(app, hot)


def build_server_state(engine, tokenizer, model_name: str = "tiny", max_waiting: int | None = None,
                       metrics: bool = True) -> ServeState:
    """An engine loop (started) around `engine`, and the state the app serves it with."""
    server_metrics = ServerMetrics(model_name, speculative_positions(engine.config)) if metrics else None
    loop = EngineLoop(engine, max_waiting=max_waiting, metrics=server_metrics).start()
    return ServeState(loop, tokenizer, model_name, engine.max_model_len)
