"""Server-sent events that notice a client leaving at once.

Starlette's StreamingResponse (under uvicorn's ASGI 2.4) only learns that a client has gone
when its next write fails, and a request still waiting in the queue writes nothing. This
response listens for `http.disconnect` the whole time, so a client that leaves mid-stream (or
while queued) is aborted and its pages freed before the engine's next step.
"""
from __future__ import annotations

import asyncio

from starlette.responses import Response

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, events, on_disconnect=None, headers: dict | None = None):
        """`events`: an async generator of encoded SSE frames; `on_disconnect()`: called (once at
        least) if the client goes away before the last frame."""
        self.events = events
        self.on_disconnect = on_disconnect or (lambda: None)
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope, receive, send) -> None:
        finished = False

        async def watch():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        self.on_disconnect()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for frame in self.events:
                if frame.endswith(DONE):  # the stream's last frame: it and the body's end in one write
                    finished = True
                    await send({"type": "http.response.body", "body": frame, "more_body": False})
                    break
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            else:
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # uvicorn's ClientDisconnected: the write found the client gone
            if not finished:
                self.on_disconnect()
        finally:
            watcher.cancel()
            await self.events.aclose()


async def wait_for_disconnect(receive) -> None:
    """Returns when the client has gone (for non-streaming handlers that wait on the engine)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def frame(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


DONE = b"data: [DONE]\n\n"
