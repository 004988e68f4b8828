"""`/dashboard`: a live page for the projector, and the controls an instructor uses in a lecture.

    GET  /dashboard            the page (static/dashboard.html + .js + .css: no build step)
    GET  /dashboard/events     server-sent events: a snapshot of the engine 4 times a second
    GET  /dashboard/state      one snapshot (JSON)
    POST /dashboard/control    {"action": "pause" | "resume" | "step" | "admission" | "burst", ...}

A snapshot (see `EngineLoop.build_snapshot`) is built by the engine's loop between steps, so
what the page shows is always one consistent moment: seats, queue, pages, rolling numbers.
Seat history for the turnstile is only recorded while a dashboard is connected.

Who may press the buttons: anyone who can reach the server, while it listens on loopback only
(a student's laptop). A server that others can reach (`--host 0.0.0.0`, a LAN address, a name)
has a control token, printed at start: a control request without `Authorization: Bearer TOKEN`
gets 403 with an OpenAI-style JSON error, and the page, opened without `?token=`, is view only.
Watching (the page, its events, its state) stays open to the room.

Paused: the engine takes no step, and everything else goes on. Requests are accepted (200, or a
400 / 429 as always) and wait in the queue until Resume (or a Step): the page says so in a banner,
`/health` answers 200 with `"paused": true`, `/metrics` has `course_lib_engine_paused 1`. Not a
503: a pause is the instructor's choice, not a failure, and a liveness probe that failed would
restart the server (Kubernetes); vLLM's own /health stays 200 while it is paused or asleep too and
reports that state apart (`/is_paused`, `/is_sleeping`).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import json
import random
import secrets
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from course_lib.scheduler.sampling import SamplingParams

from .protocol import APIError, parse_json
from .sse import EventStream, frame

STATIC = Path(__file__).resolve().parent / "static"
# What the page loads, by the name it asks for: (file in static/, media type). Nothing else is served.
STATIC_FILES = {"app.js": ("dashboard.js", "application/javascript"),
                "colours.js": ("colours.js", "application/javascript"),
                "turnstile_window.js": ("turnstile_window.js", "application/javascript"),
                "style.css": ("dashboard.css", "text/css")}
EVENT_INTERVAL_S = 0.25
MAX_BURST = 1000
TOKEN_BYTES = 16  # a control token's randomness (secrets.token_urlsafe: 22 characters)


# ------------------------------------------------------------------------------------ the token
def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a wildcard ("", "0.0.0.0" parses: not loopback) or a host name: others may reach it
        return False


def control_token_for(host: str, given: str | None = None) -> str | None:
    """The token the dashboard's controls need: `given` when set (anywhere); else a fresh random
    one when `host` lets others in; else None (loopback: no token, as students run it)."""
    if given is not None:
        if not given.strip():
            raise ValueError("--control-token must not be empty")
        return given
    return None if is_loopback(host) else secrets.token_urlsafe(TOKEN_BYTES)


def check_control_token(request: Request, token: str | None) -> None:
    """Raise a 403 APIError unless the request carries `token` (None: nothing to check)."""
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise APIError("the dashboard's controls need the control token that `serve` printed at start (this server "
                       "listens beyond loopback): send 'Authorization: Bearer TOKEN', or open /dashboard?token=TOKEN",
                       status=403, type="permission_error", code="control_token_required")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise APIError("wrong control token: use the one `serve` printed at start", status=403,
                       type="permission_error", code="control_token_wrong")


# ------------------------------------------------------------------------------------ paused
PAUSED_DETAIL = ("the engine is paused from the dashboard: requests are accepted and wait in the queue until it "
                 "resumes (or takes a single step)")


def paused_metric(model_name: str, paused: bool) -> bytes:
    """`/metrics`' lines for the pause (Prometheus text; the label value escaped as the format says)."""
    label = model_name.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
    return ("# HELP course_lib_engine_paused 1 while the engine is paused from the dashboard: requests are "
            "accepted and wait in the queue until it resumes\n"
            "# TYPE course_lib_engine_paused gauge\n"
            f'course_lib_engine_paused{{model_name="{label}"}} {int(paused)}\n').encode()


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
        snap["controls_locked"] = state.control_token is not None
        state.paused = snap["paused"]  # what /health and /metrics say (an engine process has no other way)
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
            check_control_token(request, state.control_token)
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
        *(Route(f"/dashboard/{name}", static(*served), methods=["GET"]) for name, served in STATIC_FILES.items()),
        Route("/dashboard/events", events, methods=["GET"]),
        Route("/dashboard/state", state_json, methods=["GET"]),
        Route("/dashboard/control", control, methods=["POST"]),
    ]
