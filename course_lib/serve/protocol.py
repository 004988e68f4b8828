"""The OpenAI wire format: request bodies in, (prompt ids, SamplingParams) out; error bodies.

Every problem with a request is an `APIError`, answered as OpenAI does:
`{"error": {"message", "type", "param", "code"}}` with an HTTP status (400 for bad input, 429
when the queue is full). Messages name the problem and the limit.

What is supported, beyond the basics (`model`, `prompt` / `messages`, `max_tokens`, `temperature`,
`top_p`, `seed`, `stream`, `stream_options.include_usage`):

- `prompt` may be a string or a list of token ids (one prompt per request: no batches);
- extensions, as vLLM spells them: `top_k`, `ignore_eos`, `stop_token_ids`, and `return_token_ids`
  (the answer's ids in each choice, so clients can compare tokens exactly).

Refused with a 400 (not silently ignored): `n` > 1, `best_of` > 1, `logprobs` / `top_logprobs`,
`echo`, `stop` strings, non-zero presence / frequency penalties, tools.

The chat template (documented here because the tiny model has none): the tiny model knows no
roles, only task prompts like "reverse: 58213", so a conversation's prompt is the content of its
**last user message** (earlier turns are context a one-shot puzzle solver cannot use). A Hugging
Face tokenizer with a chat template uses `apply_chat_template`; one without gets
"role: content" lines followed by "assistant:".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from course_lib.scheduler.sampling import SamplingParams

MAX_BODY_BYTES = 1 << 20  # a request body larger than this is refused (prompts here are short)


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


@dataclass
class ParsedRequest:
    """A validated request, ready for the engine."""

    kind: str  # "completion" or "chat"
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool


def parse_json(raw: bytes) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(f"request body of {len(raw)} bytes is larger than the limit of {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


# ------------------------------------------------------------------------------------ fields
def _integer(body, name, default=None, minimum=None):
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name} must be an integer, got {value!r}", param=name)
    if minimum is not None and value < minimum:
        raise APIError(f"{name} must be >= {minimum}, got {value}", param=name)
    return value


def _number(body, name, default, lo, hi):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(f"{name} must be a number, got {value!r}", param=name)
    if not lo <= value <= hi:
        raise APIError(f"{name} must be in [{lo}, {hi}], got {value}", param=name)
    return float(value)


def _flag(body, name, default=False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _refuse_unsupported(body) -> None:
    """Options we do not implement: say so instead of quietly doing something else."""
    n = _integer(body, "n", 1)
    if n != 1:
        raise APIError(f"n must be 1 (one choice per request), got {n}", param="n", code="unsupported")
    best_of = _integer(body, "best_of", 1)
    if best_of is not None and best_of != 1:
        raise APIError(f"best_of must be 1, got {best_of}", param="best_of", code="unsupported")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) not in (None, False, 0):
            raise APIError(f"{name} is not supported by this server", param=name, code="unsupported")
    if body.get("echo"):
        raise APIError("echo is not supported by this server", param="echo", code="unsupported")
    if body.get("stop") not in (None, [], ""):
        raise APIError("stop strings are not supported; use stop_token_ids (a list of token ids)",
                       param="stop", code="unsupported")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise APIError(f"{name} is not supported (only 0)", param=name, code="unsupported")
    if body.get("tools") or body.get("functions"):
        raise APIError("tools / function calling are not supported", param="tools", code="unsupported")


def check_model(body, served_name: str) -> None:
    """`model` must name the served model (a missing one means it, for curl users' convenience)."""
    model = body.get("model")
    if model is None:
        return
    if model != served_name:
        raise APIError(f"unknown model {model!r}: this server serves {served_name!r} (see /v1/models)",
                       param="model", code="model_not_found")


def _sampling(body, max_tokens_default: int) -> SamplingParams:
    name = "max_tokens"
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"  # the newer chat spelling
    max_tokens = _integer(body, name, minimum=1)
    if max_tokens is None:
        max_tokens = max_tokens_default
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise APIError(f"stop_token_ids must be a list of integers, got {stop_ids!r}", param="stop_token_ids")
    top_k = _integer(body, "top_k", 0, minimum=-1)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1.0,
            top_k=top_k,
            seed=_integer(body, "seed"),
            stop_token_ids=stop_ids,
            ignore_eos=_flag(body, "ignore_eos"),
        )
    except ValueError as err:  # SamplingParams' own checks (e.g. top_p == 0)
        raise APIError(str(err)) from None


def _stream_options(body) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(f"stream_options must be an object, got {options!r}", param="stream_options")
    include_usage = bool(options.get("include_usage", False))
    if include_usage and not stream:
        raise APIError("stream_options is only allowed with stream: true", param="stream_options")
    return stream, include_usage


# ------------------------------------------------------------------------------------ prompts
def encode_text(tokenizer, text: str, param: str) -> list[int]:
    if not text:
        raise APIError(f"{param} is empty: a request needs at least 1 token", param=param)
    try:
        if hasattr(tokenizer, "encode_prompt"):  # the tiny model's CharTokenizer: <bos> text =
            return tokenizer.encode_prompt(text)
        return list(tokenizer.encode(text))
    except ValueError as err:
        raise APIError(f"{param} cannot be tokenized: {err}", param=param) from None


def completion_prompt(body, tokenizer) -> list[int]:
    if "prompt" not in body:
        raise APIError("missing required field 'prompt'", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt, "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise APIError("prompt is empty: a request needs at least 1 token", param="prompt")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if all(isinstance(p, (str, list)) for p in prompt):
            raise APIError(f"batched prompts are not supported: send one prompt per request (got {len(prompt)})",
                           param="prompt", code="unsupported")
    raise APIError("prompt must be a string or a list of token ids", param="prompt")


def chat_prompt(body, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content} objects", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise APIError(f"messages[{i}] needs a role of system, developer, user or assistant", param="messages")
        if not isinstance(m.get("content"), str):
            raise APIError(f"messages[{i}].content must be a string (no images or parts)", param="messages")
    if hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not ids:
            raise APIError("messages give an empty prompt", param="messages")
        return list(ids)
    if hasattr(tokenizer, "encode_prompt"):  # the tiny model: the last user message (see the docstring)
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise APIError("messages need at least one user message", param="messages")
        return encode_text(tokenizer, users[-1], "messages")
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return encode_text(tokenizer, text, "messages")


def parse_request(kind: str, body: dict, tokenizer, served_name: str, max_model_len: int) -> ParsedRequest:
    """Validate an OpenAI body (`kind` "completion" or "chat"). Engine-side limits (vocabulary,
    context, pool) are checked by the engine when the request is added; see EngineLoop."""
    check_model(body, served_name)
    _refuse_unsupported(body)
    stream, include_usage = _stream_options(body)
    prompt = completion_prompt(body, tokenizer) if kind == "completion" else chat_prompt(body, tokenizer)
    # OpenAI's defaults: 16 tokens for completions; chat answers may run to the end of the context.
    default = 16 if kind == "completion" else max(1, max_model_len - len(prompt))
    params = _sampling(body, default)
    return ParsedRequest(kind, prompt, params, stream, include_usage, _flag(body, "return_token_ids"))


def param_of_engine_error(message: str, kind: str) -> str | None:
    """Which field an engine ValueError is about (its messages name prompts or max_tokens)."""
    if "max_tokens" in message and "prompt" not in message.split("(")[0]:
        return "max_tokens"
    return "prompt" if kind == "completion" else "messages"


def finish_reason(engine_reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words: EOS and stop ids are "stop", the limits "length"."""
    if engine_reason in ("eos", "stop"):
        return "stop"
    return engine_reason


class IncrementalDecoder:
    """Token ids in, new text out. A character tokenizer decodes piece by piece; other tokenizers
    re-decode the whole answer and emit what grew (merges and multi-byte characters only make
    sense in context), holding back a trailing partial character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.piecewise = hasattr(tokenizer, "encode_prompt")
        self.ids: list[int] = []
        self.text = ""

    def push(self, new_ids) -> str:
        if self.piecewise:
            return self.tokenizer.decode(new_ids)
        self.ids.extend(new_ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):
            return ""
        delta, self.text = full[len(self.text):], full
        return delta
