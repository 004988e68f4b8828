"""Every problem with a request is an `APIError`, answered as OpenAI does:
`{"error": {"message", "type", "param", "code"}}` with an HTTP status (400 for bad input, 404 for an
unknown model, 413 for a body over the limit, 429 when the queue is full). Messages name the problem
and the limit."""
from __future__ import annotations


class APIError(Exception):
    """A request the server refuses, with everything the OpenAI error body needs."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def shown(value, limit: int = 60) -> str:
    """A client's value in an error message: its repr, cut short (it may be a megabyte long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
