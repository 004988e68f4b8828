"""Which request fields the server knows: each one is honoured, or refused with a 400 naming it.

A client that sends a field we quietly skip gets an answer to a question it did not ask (a
`logit_bias` that biases nothing, a `min_tokens` that ends early), and a benchmark built on it
measures the wrong thing. So every top-level field of a body falls in one of three groups:

- HONOURED: read and acted on by protocol.py (per endpoint);
- NEUTRAL_ONLY: fields OpenAI or vLLM define that this server does not implement. They are accepted
  only at the value that asks for nothing (`min_p` 0, `echo` false in chat, `null`
  for any of them), so clients that send the defaults explicitly keep working; any other value is a
  400 saying the field is not supported by this server;
- anything else: a 400 naming the unknown field.

To implement one of the NEUTRAL_ONLY fields, move it to HONOURED and read it in protocol.py.
"""
from __future__ import annotations

from .errors import APIError, shown

ENDPOINTS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}

_COMMON = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
           "stream_options", "stop", "include_stop_str_in_output", "stop_token_ids", "ignore_eos",
           "return_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
           "logit_bias", "skip_special_tokens", "n", "best_of", "logprobs",
           "user"}  # OpenAI's end-user id: metadata for abuse monitoring, no effect on the answer there either
# `echo` is the completions endpoint's; `top_logprobs` chat's (completions' `logprobs` is the count itself).
HONOURED = {"completion": _COMMON | {"prompt", "echo"}, "chat": _COMMON | {"messages", "top_logprobs"}}


def _null_or(*values):
    """Accepts null or one of `values`, of the same JSON type (true is not 1, 1.0 is)."""
    def accepts(value) -> bool:
        return value is None or any(value == v and (type(value) is type(v) or {type(value), type(v)} == {int, float})
                                    for v in values)
    return accepts


_NOT_SUPPORTED = "not supported by this server"
# name: (accepts(value), the neutral value in words, why anything else is refused)
NEUTRAL_ONLY = {
    "echo": (_null_or(False), "false", _NOT_SUPPORTED + " in chat (completions echo the prompt)"),
    "top_logprobs": (_null_or(), "null", _NOT_SUPPORTED + " in completions (there `logprobs` is the count)"),
    "prompt_logprobs": (_null_or(), "null", _NOT_SUPPORTED),
    "min_p": (_null_or(0), "0", _NOT_SUPPORTED),
    "response_format": (_null_or({"type": "text"}), 'null or {"type": "text"}', _NOT_SUPPORTED + " (no guided output)"),
    "suffix": (_null_or(""), 'null or ""', _NOT_SUPPORTED),
    "truncate_prompt_tokens": (_null_or(), "null", _NOT_SUPPORTED),
    "tools": (_null_or([]), "null or []", _NOT_SUPPORTED + " (no tool calling)"),
    "functions": (_null_or([]), "null or []", _NOT_SUPPORTED + " (no tool calling)"),
    "tool_choice": (_null_or("none"), 'null or "none"', _NOT_SUPPORTED + " (no tool calling)"),
    "function_call": (_null_or("none"), 'null or "none"', _NOT_SUPPORTED + " (no tool calling)"),
    "parallel_tool_calls": (_null_or(), "null", _NOT_SUPPORTED + " (no tool calling)"),
    **{name: (_null_or(), "null", _NOT_SUPPORTED + " (no guided output)")
       for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                    "guided_whitespace_pattern", "structured_outputs")},
}


def refuse_unsupported(body: dict, kind: str) -> None:
    """A 400 for the first field of `body` (in the client's order) that this server would not honour."""
    honoured = HONOURED[kind]
    for name, value in body.items():
        if name in honoured:
            continue
        rule = NEUTRAL_ONLY.get(name)
        if rule is None:
            raise APIError(f"unknown field {shown(name)}: {_NOT_SUPPORTED}'s {ENDPOINTS[kind]}, which honours "
                           f"{', '.join(sorted(honoured))}", param=name[:60], code="unsupported")
        accepts, neutral, why = rule
        if not accepts(value):
            raise APIError(f"{name} must be {neutral} ({why}), got {shown(value)}", param=name, code="unsupported")
