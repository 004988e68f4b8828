"""The OpenAI wire format: request bodies in, (prompt ids, SamplingParams) out; error bodies.

Every problem with a request is an `APIError` (errors.py): 400 for bad input, naming the field and
the limit; 404 for a model this server does not serve; 413 for a body over 1 MiB (request_body.py);
429 when the queue is full. Every field is honoured or refused, never ignored (request_fields.py
lists which are which).

Honoured: `model`, `prompt` / `messages`, `max_tokens` (or `max_completion_tokens`),
`temperature`, `top_p`, `seed`, `stream`, `stream_options` (`include_usage`, and vLLM's
`continuous_usage_stats`: the running usage in every chunk), `stop`, `user` (metadata only), and

- `prompt` may be a string or a list of token ids, or a list holding one of those (one prompt per
  request: no batches); a chat message's `content` may be a string or a list of text parts;
- `stop`: a string or a list of up to 4; the answer ends where its text first contains one, and the
  text is cut before it (stop_strings.py), finish_reason "stop";
- `max_tokens` must fit the context: prompt + max_tokens <= max_model_len, or a 400 naming both
  (as vLLM; the completion default of 16 shrinks to the room left instead);
- `top_p` must be in (0, 1] (as vLLM: 0 would leave no token to sample; for greedy, temperature 0);
- `seed` must be a signed 64-bit integer;
- extensions, as vLLM spells them: `top_k`, `ignore_eos`, `stop_token_ids`,
  `include_stop_str_in_output`, and `return_token_ids` (the answer's ids in each choice, so clients
  can compare tokens exactly);
- as vLLM defines them (SamplingParams, logit_adjust.py): `presence_penalty` and
  `frequency_penalty` in [-2, 2], `repetition_penalty` > 0, `min_tokens` in [0, max_tokens],
  `logit_bias` ({"token id": bias in [-100, 100]}, up to 300 entries; an id outside the vocabulary
  is a 400 from the engine), and `skip_special_tokens` (false: special tokens such as `<eos>` stay
  in the text).

Accepted only at their neutral value, refused with a 400 otherwise: `n` and `best_of` (1),
`logprobs` / `top_logprobs`, `echo`, `min_p`, `response_format` / guided output, `suffix`,
`truncate_prompt_tokens`, `prompt_logprobs`, tools. Any other field is a 400 naming it.

The chat template (documented here because the tiny model has none): the tiny model knows no
roles, only task prompts like "reverse: 58213", so a conversation's prompt is the content of its
**last user message** (earlier turns are context a one-shot puzzle solver cannot use). A Hugging
Face tokenizer with a chat template uses `apply_chat_template`; one without gets
"role: content" lines followed by "assistant:".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_lib.scheduler.sampling import SamplingParams

from .errors import APIError, error_body, shown
from .request_body import MAX_BODY_BYTES, parse_json
from .request_fields import refuse_unsupported

__all__ = ["APIError", "error_body", "parse_json", "parse_request", "MAX_BODY_BYTES", "ParsedRequest",
           "IncrementalDecoder", "finish_reason", "param_of_engine_error"]

INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # per stop string: each is looked for at every token
MAX_STOP_TOKEN_IDS = 64  # the engine checks every sampled token against the list
MAX_LOGIT_BIAS = 300  # entries, as OpenAI's limit


@dataclass
class ParsedRequest:
    """A validated request, ready for the engine."""

    kind: str  # "completion" or "chat"
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    stop: list[str] = field(default_factory=list)  # stop strings (the engine sees only stop_token_ids)
    include_stop_str: bool = False
    continuous_usage: bool = False  # usage in every streamed chunk


# ------------------------------------------------------------------------------------ fields
def _integer(body, name, default=None, minimum=None, maximum=None, limit_words=""):
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name} must be an integer, got {shown(value)}", param=name)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        limit = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise APIError(f"{name} must be {limit}{limit_words}, got {value}", param=name)
    return value


def _number(body, name, default, lo, hi, lo_open=False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(f"{name} must be a number, got {shown(value)}", param=name)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        raise APIError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}", param=name)
    return float(value)


def _flag(body, name, default=False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{name} must be true or false, got {shown(value)}", param=name)
    return value


def check_model(body, served_name: str | tuple) -> None:
    """`model` must name the served model, or one of its names (a tuple: vLLM's --served-model-name
    takes several); a missing one means it, for curl users' convenience. Another name is a 404, as
    OpenAI and vLLM answer it."""
    model = body.get("model")
    if model is None:
        return
    names = (served_name,) if isinstance(served_name, str) else tuple(served_name)
    if not any(type(model) is str and model == name for name in names):
        raise APIError(f"unknown model {shown(model)}: this server serves {' or '.join(map(repr, names))} "
                       f"(see /v1/models)", status=404, param="model", code="model_not_found")


def _max_tokens(body, prompt_len: int, max_model_len: int, default: int) -> int:
    """`max_tokens` (or `max_completion_tokens`), which must leave the prompt room in the context."""
    asked = {name: _integer(body, name, minimum=1) for name in ("max_tokens", "max_completion_tokens")}
    given = {name: value for name, value in asked.items() if value is not None}
    if len(given) == 2 and asked["max_tokens"] != asked["max_completion_tokens"]:
        raise APIError(f"max_tokens ({asked['max_tokens']}) and max_completion_tokens "
                       f"({asked['max_completion_tokens']}) disagree: send one", param="max_completion_tokens")
    room = max_model_len - prompt_len
    if not given:
        return min(default, room) if room >= 1 else default  # a prompt with no room: the engine names its limit
    name, value = next(iter(given.items()))
    if room >= 1 and value > room:
        raise APIError(f"{name} of {value} does not fit the context: the prompt has {prompt_len} tokens and "
                       f"max_model_len is {max_model_len}, so {name} can be at most {room}",
                       param=name, code="context_length_exceeded")
    return value


def _stop_token_ids(body) -> list[int]:
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t <= INT64[1] for t in ids):
        raise APIError(f"stop_token_ids must be a list of token ids (integers >= 0), got {shown(ids)}",
                       param="stop_token_ids")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise APIError(f"stop_token_ids has {len(ids)} ids; the limit is {MAX_STOP_TOKEN_IDS}", param="stop_token_ids")
    return ids


def _stop_strings(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError(f"stop must be a string or a list of up to {MAX_STOP_STRINGS} strings, got {shown(stop)}",
                       param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(f"stop has {len(stops)} strings; the limit is {MAX_STOP_STRINGS}", param="stop")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise APIError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters, got {shown(s)}",
                           param="stop")
    return list(dict.fromkeys(stops))


def _logit_bias(body) -> dict[int, float] | None:
    """JSON keys are strings: {"17": -100} biases token 17. Ids and biases must be numbers in range."""
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise APIError(f"logit_bias must be an object {{\"token id\": bias}}, got {shown(bias)}", param="logit_bias")
    if len(bias) > MAX_LOGIT_BIAS:
        raise APIError(f"logit_bias has {len(bias)} entries; the limit is {MAX_LOGIT_BIAS}", param="logit_bias")
    parsed = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 19):
            raise APIError(f"logit_bias keys must be token ids (integers >= 0 written as strings), got {shown(key)}",
                           param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not -100 <= value <= 100:
            raise APIError(f"logit_bias of token {key} must be a number in [-100, 100], got {shown(value)}",
                           param="logit_bias")
        parsed[int(key)] = float(value)
    return parsed or None


def _sampling(body, max_tokens: int) -> SamplingParams:
    min_tokens = _integer(body, "min_tokens", 0, minimum=0, maximum=max_tokens,
                          limit_words=" (it cannot exceed max_tokens)")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            # vLLM's rule: top_p 0 would leave no token to sample (for greedy, send temperature 0).
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=_integer(body, "top_k", 0, minimum=-1, maximum=INT64[1]),
            seed=_integer(body, "seed", minimum=INT64[0], maximum=INT64[1], limit_words=" (a signed 64-bit integer)"),
            stop_token_ids=_stop_token_ids(body),
            ignore_eos=_flag(body, "ignore_eos"),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, math.inf, lo_open=True),
            min_tokens=0 if min_tokens is None else min_tokens,
            logit_bias=_logit_bias(body),
            skip_special_tokens=_flag(body, "skip_special_tokens", True),
        )
    except ValueError as err:  # SamplingParams' own checks
        raise APIError(str(err)) from None


def _stream_options(body) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage): stream_options' keys are honoured or refused too."""
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not isinstance(options, dict):
        raise APIError(f"stream_options must be an object, got {shown(options)}", param="stream_options")
    for key in options:
        if key not in ("include_usage", "continuous_usage_stats"):
            raise APIError(f"stream_options.{shown(key, 40)} is not supported by this server (it honours "
                           f"include_usage and continuous_usage_stats)", param="stream_options", code="unsupported")
    include_usage = _flag(options, "include_usage")
    continuous = _flag(options, "continuous_usage_stats")
    if (include_usage or continuous) and not stream:
        raise APIError("stream_options is only allowed with stream: true", param="stream_options")
    # vLLM's rule: usage in every chunk when both are set
    return stream, include_usage, include_usage and continuous


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


def _token_ids(prompt) -> bool:
    return all(type(t) is int for t in prompt)


def completion_prompt(body, tokenizer) -> list[int]:
    if "prompt" not in body:
        raise APIError("missing required field 'prompt'", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one (AIPerf sends its prompt so) is that prompt
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt, "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise APIError("prompt is empty: a request needs at least 1 token", param="prompt")
        if _token_ids(prompt):
            return list(prompt)
        if all(isinstance(p, (str, list)) for p in prompt):
            raise APIError(f"batched prompts are not supported: send one prompt per request (got {len(prompt)})",
                           param="prompt", code="unsupported")
    raise APIError("prompt must be a string or a list of token ids", param="prompt")


MESSAGE_KEYS = {"role", "content", "name"}


def _message_text(i: int, content) -> str:
    """A message's content: a string, or a list of text parts (joined with newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(f"messages[{i}].content[{j}] is a {shown(kind, 30)} part: this server takes text "
                               f"parts only ({{\"type\": \"text\", \"text\": ...}})", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError(f"messages[{i}].content must be a string or a list of text parts, got {shown(content)}",
                   param="messages")


def _messages(body) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise APIError(f"messages[{i}] needs a role of system, developer, user or assistant", param="messages")
        extra = sorted(set(m) - MESSAGE_KEYS)
        if extra:
            raise APIError(f"messages[{i}] has {shown(extra[0], 40)}, not supported by this server (a message "
                           f"has role, content and name)", param="messages", code="unsupported")
        plain.append({**m, "content": _message_text(i, m.get("content"))})
    return plain


def chat_prompt(body, tokenizer) -> list[int]:
    messages = _messages(body)
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


def parse_request(kind: str, body: dict, tokenizer, served_name: str | tuple, max_model_len: int) -> ParsedRequest:
    """Validate an OpenAI body (`kind` "completion" or "chat"). Engine-side limits (vocabulary,
    pool) are checked by the engine when the request is added; see EngineLoop."""
    check_model(body, served_name)
    refuse_unsupported(body, kind)
    stream, include_usage, continuous_usage = _stream_options(body)
    stop = _stop_strings(body)
    prompt = completion_prompt(body, tokenizer) if kind == "completion" else chat_prompt(body, tokenizer)
    # OpenAI's defaults: 16 tokens for completions; chat answers may run to the end of the context.
    default = 16 if kind == "completion" else max(1, max_model_len - len(prompt))
    params = _sampling(body, _max_tokens(body, len(prompt), max_model_len, default))
    return ParsedRequest(kind, prompt, params, stream, include_usage, _flag(body, "return_token_ids"), stop,
                         _flag(body, "include_stop_str_in_output"), continuous_usage)


def param_of_engine_error(message: str, kind: str) -> str | None:
    """Which field an engine ValueError is about (its messages name prompts or max_tokens)."""
    if message.startswith("logit_bias"):
        return "logit_bias"
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
    sense in context), holding back a trailing partial character. `skip_special_tokens` false keeps
    special tokens (`<eos>`) in the text, as vLLM's field of that name."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.piecewise = hasattr(tokenizer, "encode_prompt")
        self.ids: list[int] = []
        self.text = ""

    def push(self, new_ids) -> str:
        if self.piecewise:
            return self.tokenizer.decode(new_ids, skip_special=self.skip_special)
        self.ids.extend(new_ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special)
        if full.endswith("\ufffd"):
            return ""
        delta, self.text = full[len(self.text):], full
        return delta
