"""A request body in: its size limited while it is read, then parsed as strict JSON with limits.

Every request's body goes through `limit_body` (app.py wraps the ASGI `receive` of every HTTP
request with it): a body larger than MAX_BODY_BYTES is refused with a 413 as soon as its declared
length says so, or as soon as the bytes read pass the limit, so the server never holds more than
the limit plus one network chunk of any body. Reading the whole body first (Starlette's
`request.body()` alone) let a 300 MiB POST take the HTTP process to 631 MiB.

`parse_json` then refuses, with a 400 naming the limit, what Python's json module would accept
or crash on: nesting deeper than MAX_JSON_DEPTH (50,000 brackets raised RecursionError, a 500),
NaN and Infinity (not JSON, and a float field would carry them into the engine), numbers too large
for a float, and integers of more digits than any field can use.
"""
from __future__ import annotations

import json
import math

from .errors import APIError

MAX_BODY_BYTES = 1 << 20  # a request body larger than this is refused (prompts here are short)
MAX_JSON_DEPTH = 64  # a chat request with content parts nests 5 deep
MAX_INT_DIGITS = 40  # 64-bit integers have at most 20; anything longer is refused before int() runs


def body_too_large(limit: int = MAX_BODY_BYTES) -> APIError:
    return APIError(f"request body is larger than the limit of {limit} bytes ({limit >> 20} MiB)", status=413,
                    code="body_too_large", headers={"Connection": "close"})


def declared_too_large(scope, limit: int = MAX_BODY_BYTES) -> bool:
    """True if the request's Content-Length header already says its body is over the limit."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


def limit_body(receive, limit: int = MAX_BODY_BYTES):
    """`receive` that raises the 413 APIError once the body's bytes so far pass `limit` (for bodies
    sent without a Content-Length, or with a false one)."""
    seen = 0

    async def limited():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise body_too_large(limit)
        return message

    return limited


# ------------------------------------------------------------------------------------ strict JSON
def _no_constant(name: str):
    raise APIError(f"request body is not valid JSON: {name} is not a JSON number (numbers must be finite)",
                   code="invalid_json")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise APIError(f"request body has the number {text[:40]} that is too large for a 64-bit float",
                       code="invalid_json")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise APIError(f"request body has an integer of {len(text.lstrip('-'))} digits; integers here have at "
                       f"most {MAX_INT_DIGITS} digits (64-bit fields take up to 20)", code="invalid_json")
    return int(text)


def _too_deep() -> APIError:
    return APIError(f"request body is nested deeper than the limit of {MAX_JSON_DEPTH} levels of arrays and objects",
                    code="invalid_json")


def _check_depth(value) -> None:
    """Iterative (a recursive walk is what the limit protects against)."""
    todo = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        children = node.values() if isinstance(node, dict) else node
        todo.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or an APIError (400; 413 past the size limit) naming the problem."""
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:  # fewer brackets cannot nest deeper: skip the walk
        _check_depth(body)
    return body
