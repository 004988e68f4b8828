"""`/dashboard`: a live page for the projector, and the controls an instructor uses in a lecture.

    GET  /dashboard            the page (static/dashboard.html + .js + .css: no build step)
    GET  /dashboard/events     server-sent events: a snapshot of the engine 4 times a second
    GET  /dashboard/state      one snapshot (JSON)
    POST /dashboard/control    {"action": "pause" | "resume" | "step" | "admission" | "burst", ...}

A snapshot (see `EngineLoop.build_snapshot`) is built by the engine's loop between steps, so
what the page shows is always one consistent moment: seats, queue, pages, rolling numbers.
Seat history for the turnstile is only recorded while a dashboard is connected.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from course_lib.scheduler.sampling import SamplingParams

from .protocol import APIError, parse_json
from .sse import EventStream, frame

STATIC = Path(__file__).resolve().parent / "static"
EVENT_INTERVAL_S = 0.25
MAX_BURST = 1000


def burst_prompts(tokenizer, n: int, counter) -> list[list[int]]:
    """`n` prompts for the burst button: tiny-model task prompts, or plain questions for a real model."""
    if hasattr(tokenizer, "encode_prompt"):
        from course_lib.model.tasks import sample_task

        return [tokenizer.encode_prompt(sample_task(random.Random(next(counter)))[0]) for _ in range(n)]
    return [list(tokenizer.encode(f"Count from one to ten. ({next(counter)})")) for _ in range(n)]


def dashboard_routes(state) -> list[Route]:
    loop = state.loop
    counter = itertools.count(10_000)

    async def current() -> dict:
        snap = await loop.ask("snapshot")
        snap["model"] = state.model_name
        return snap

    def static(name: str, media_type: str):
        async def serve(request):
            return Response((STATIC / name).read_bytes(), media_type=media_type, headers={"Cache-Control": "no-cache"})

        return serve

    async def page(request):
        return HTMLResponse((STATIC / "dashboard.html").read_text())

    async def state_json(request):
        return JSONResponse(await current())

    async def events(request):
        gone = asyncio.Event()

        async def stream():
            while not gone.is_set():
                yield frame(json.dumps(await current(), separators=(",", ":")))
                try:
                    await asyncio.wait_for(gone.wait(), EVENT_INTERVAL_S)
                except asyncio.TimeoutError:
                    pass

        return EventStream(stream(), on_disconnect=gone.set)

    async def control(request: Request):
        try:
            body = parse_json(await request.body())
            result = await _control(body)
        except APIError as err:
            return JSONResponse(err.body(), status_code=err.status)
        snap = await current()
        return JSONResponse({"ok": True, **result, "paused": snap["paused"], "admission": snap["admission"],
                             "step": snap["step"]})

    async def _control(body: dict) -> dict:
        action = body.get("action")
        if action in ("pause", "resume", "step"):
            await loop.ask(action)
        elif action == "admission":
            policy = body.get("policy")
            try:
                await loop.ask("admission", policy)
            except ValueError as err:
                raise APIError(str(err), param="policy") from None
        elif action == "burst":
            n = body.get("n", 20)
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BURST:
                raise APIError(f"burst size n must be an integer in [1, {MAX_BURST}], got {n!r}", param="n")
            prompts = burst_prompts(state.tokenizer, n, counter)
            params = SamplingParams(max_tokens=state.burst_max_tokens, temperature=0.0)
            accepted = await loop.ask("inject", prompts, params)
            return {"injected": accepted}
        else:
            raise APIError(f"unknown action {action!r}; use pause, resume, step, admission or burst", param="action")
        return {}

    return [
        Route("/dashboard", page, methods=["GET"]),
        Route("/dashboard/", page, methods=["GET"]),
        Route("/dashboard/app.js", static("dashboard.js", "application/javascript"), methods=["GET"]),
        Route("/dashboard/style.css", static("dashboard.css", "text/css"), methods=["GET"]),
        Route("/dashboard/events", events, methods=["GET"]),
        Route("/dashboard/state", state_json, methods=["GET"]),
        Route("/dashboard/control", control, methods=["POST"]),
    ]
