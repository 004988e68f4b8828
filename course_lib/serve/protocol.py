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

Parallel sampling and log-probabilities (SamplingParams explains how the engine computes them):

- `n` (>= 1; at most the engine's max_num_seqs, a 400 naming it) answers in `choices`, each with its
  `index`; streamed, every chunk carries one choice and its `index` (chunks of different choices
  interleave). The samples share the prompt's pages in the engine; with a `seed`, choice i is drawn
  with seed + i, so choice 0 is the n = 1 answer;
- `best_of` (>= n, null: n): that many samples are generated and the n of highest cumulative
  logprob returned, best first (as vLLM and OpenAI's legacy completions); not with `stream` (the
  best are known only at the end, OpenAI's rule too); usage counts every sample's tokens;
- `logprobs`: completions: an integer in [0, 20], the alternatives per token, in OpenAI's shape
  (`tokens`, `token_logprobs`, `top_logprobs` (the sampled token and the k most likely, as vLLM),
  `text_offset`); chat: true / false, with `top_logprobs` in [0, 20] (only with logprobs true), in
  the chat shape (`content`: token, logprob, bytes, top_logprobs). Raw log-probabilities of the model
  (before penalties, temperature, top-k / top-p); tokens ended by a stop string are left out;
- `echo` (completions): the prompt's text before the answer (its first chunk when streaming); not
  with logprobs (that would need the prompt's logprobs, which this server does not compute).

Accepted only at their neutral value, refused with a 400 otherwise: `echo` in chat, `top_logprobs`
in completions, `min_p`, `response_format` / guided output, `suffix`, `truncate_prompt_tokens`,
`prompt_logprobs`, tools. Any other field is a 400 naming it.

The chat template (documented here because the tiny model has none): the tiny model knows no
roles, only task prompts like "reverse: 58213", so a conversation's prompt is the content of its
**last user message** (earlier turns are context a one-shot puzzle solver cannot use). A Hugging
Face tokenizer with a chat template uses `apply_chat_template`; one without gets
"role: content" lines followed by "assistant:".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_lib.scheduler.sampling import MAX_LOGPROBS, SamplingParams

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
    echo: bool = False  # completions: the prompt's text before the answer
    echo_text: str = ""  # ... that text: the prompt as sent, or its ids decoded

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def logprobs(self) -> int | None:
        """Alternatives per token the client asked for (None: no logprobs in the answer)."""
        return self.params.logprobs if self.asked_logprobs else None

    asked_logprobs: bool = False  # (best_of > n makes the engine compute logprobs the client did not ask for)


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


def _samples(body, stream: bool) -> tuple[int, int | None]:
    """(n, best_of): how many answers, out of how many samples."""
    n = _integer(body, "n", 1, minimum=1)
    n = 1 if n is None else n
    best_of = _integer(body, "best_of", minimum=1)
    if best_of is not None and best_of < n:
        raise APIError(f"best_of must be >= n ({n}), got {best_of}", param="best_of")
    if best_of is not None and best_of > n and stream:
        raise APIError(f"best_of ({best_of}) > n ({n}) cannot stream: the best samples are known only when all "
                       f"have ended", param="best_of")
    return n, best_of


def _logprobs(body, kind: str) -> int | None:
    """Alternatives per token (None: off). Completions: `logprobs` is the count; chat: `logprobs` is a
    flag and `top_logprobs` the count."""
    if kind == "completion":
        return _integer(body, "logprobs", minimum=0, maximum=MAX_LOGPROBS)
    asked = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs", minimum=0, maximum=MAX_LOGPROBS)
    if top and not asked:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if asked else None


def _sampling(body, max_tokens: int, n: int = 1, best_of: int | None = None,
              logprobs: int | None = None) -> SamplingParams:
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
            n=n, best_of=best_of, logprobs=logprobs,
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
    n, best_of = _samples(body, stream)
    logprobs = _logprobs(body, kind)
    echo = kind == "completion" and _flag(body, "echo")
    if echo and logprobs is not None:
        raise APIError("echo with logprobs needs the prompt's logprobs, which this server does not compute: "
                       "send one of them", param="echo", code="unsupported")
    params = _sampling(body, _max_tokens(body, len(prompt), max_model_len, default), n, best_of, logprobs)
    return ParsedRequest(kind, prompt, params, stream, include_usage, _flag(body, "return_token_ids"), stop,
                         _flag(body, "include_stop_str_in_output"), continuous_usage, echo,
                         _echo_text(body["prompt"], prompt, tokenizer) if echo else "",
                         asked_logprobs=logprobs is not None)


def _echo_text(sent, ids: list[int], tokenizer) -> str:
    """The prompt as the client sent it (as vLLM echoes a text prompt), or its token ids decoded."""
    if isinstance(sent, list) and len(sent) == 1 and isinstance(sent[0], str):
        sent = sent[0]
    if isinstance(sent, str):
        return sent
    if hasattr(tokenizer, "encode_prompt"):
        return tokenizer.decode(ids)
    return tokenizer.decode(ids, skip_special_tokens=True)


def param_of_engine_error(message: str, kind: str) -> str | None:
    """Which field an engine ValueError is about (its messages name prompts or max_tokens)."""
    if message.startswith("logit_bias"):
        return "logit_bias"
    if message.startswith(("n = ", "best_of = ")):  # parallel sampling's limits (max_num_seqs, ...)
        return message.split(" ")[0]
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
