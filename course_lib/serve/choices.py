"""Answers with several choices, logprobs or echo: n / best_of > 1, `logprobs`, `echo` (protocol.py).

The plain answer (one choice, no logprobs, no echo: nearly every request) keeps app.py's handlers,
written for speed; these handle the rest. The engine gives each sample of a request its own
deltas (`Delta.index`); each choice has its own decoder and stop strings (`Choice`), and a stop
string ends its sample alone (`abort(<sample id>, "stop")`). A streamed answer sends each choice's
tokens in chunks of their own, with its `index`, and ends with the last choice; a whole answer
waits for every sample and, with best_of > n, keeps the n of highest cumulative logprob (over the
tokens its answer kept), best first.
"""
from __future__ import annotations

import asyncio
import json
import time

from starlette.responses import JSONResponse, Response

from course_lib.scheduler.request import sample_id

from .logprobs import CompletionLogprobs, chat_logprobs
from .protocol import error_body, finish_reason
from .sse import DONE, frame, wait_for_disconnect
from .stop_strings import AnswerText


class Choice:
    """One sample's answer as the client sees it: text, ids, logprobs, how it ended."""

    def __init__(self, state, parsed, index: int, engine_id: str):
        self.index, self.engine_id = index, engine_id
        self.answer = AnswerText(state.tokenizer, parsed.stop, parsed.include_stop_str,
                                 parsed.params.skip_special_tokens)
        self.tokenizer, self.kind = state.tokenizer, parsed.kind
        self.show_logprobs = parsed.logprobs is not None
        self.echo = parsed.echo_text if parsed.echo else ""
        self.completion_logprobs = CompletionLogprobs(state.tokenizer, len(self.echo))
        self.ids: list[int] = []
        self.pieces: list[str] = [self.echo]
        self.entries: list = []  # (logprob, top) of each kept token
        self.reason: str | None = None
        self._echo_pending = bool(self.echo)  # the first chunk carries the prompt

    @property
    def done(self) -> bool:
        return self.reason is not None

    @property
    def cumulative_logprob(self) -> float:
        return sum(lp for lp, _ in self.entries)

    def push(self, ids: list[int], entries) -> tuple[str, list[int], list]:
        """(new text, the ids of `ids` the answer keeps, their logprob entries)."""
        text, kept = self.answer.push(ids) if ids else ("", [])
        kept_entries = list(entries[:len(kept)]) if entries else []
        self.ids += kept
        self.entries += kept_entries
        self.pieces.append(text)
        if self._echo_pending:
            self._echo_pending = False
            text = self.echo + text
        return text, kept, kept_entries

    def rendered_logprobs(self, ids: list[int], entries: list):
        if not self.show_logprobs:
            return None
        if self.kind == "completion":
            return self.completion_logprobs.render(ids, entries)
        return chat_logprobs(self.tokenizer, ids, entries)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _choices(state, stream, parsed) -> list[Choice]:
    k = parsed.params.num_samples
    return [Choice(state, parsed, i, stream.request_id if k == 1 else sample_id(stream.request_id, i))
            for i in range(k)]


def _usage(prompt_tokens: int, choices) -> dict:
    completion = sum(c.answer.num_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _stop_sample(state, choice: Choice) -> None:
    """A stop string ended this choice: its sample stops (the request, when it is the only one)."""
    choice.reason = "stop"
    state.loop.abort(choice.engine_id, "stop")


async def collect_choices(state, stream, parsed, render, receive):
    from .app import _engine_error, error_response

    choices = _choices(state, stream, parsed)

    async def gather():
        left = len(choices)
        while left:
            delta = await stream.queue.get()
            if delta is None:
                return None
            choice = choices[delta.index]
            if choice.done:
                continue  # a sample its stop string ended: what it made meanwhile is not the answer's
            if delta.finished and delta.finish_reason == "error":
                return delta.error or "engine error"
            choice.push(delta.new_token_ids, delta.logprobs)
            if choice.answer.stopped:
                _stop_sample(state, choice)
            elif delta.finished:
                choice.pieces.append(choice.answer.flush())
                choice.reason = finish_reason(delta.finish_reason)
            else:
                continue
            left -= 1
        return choices

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
    if isinstance(result, str):
        state.loop.abort(stream.request_id)  # the other samples' answers are lost with it
        return error_response(_engine_error(result))
    best = result
    if len(best) > parsed.n:  # best_of: the n most likely, best first (sorted is stable: ties keep order)
        best = sorted(best, key=lambda c: -c.cumulative_logprob)[:parsed.n]
    body = render.full_choices([
        render.choice(i, c.text, c.reason, c.ids if parsed.return_token_ids else None,
                      c.rendered_logprobs(c.ids, c.entries)) for i, c in enumerate(best)],
        _usage(len(parsed.prompt_token_ids), result))
    return JSONResponse(body)


async def choice_events(state, stream, parsed, render):
    from .app import stream_interval

    choices = _choices(state, stream, parsed)
    with_ids = parsed.return_token_ids
    num_prompt = len(parsed.prompt_token_ids)

    def running_usage():
        return _usage(num_prompt, choices) if parsed.continuous_usage else None

    left, finished, sent = len(choices), False, None
    state.live_streams += 1
    # A chat stream opens each choice with a chunk naming the role, sent with the first tokens (app.py).
    opening = b"".join(render.chunk("", None, [] if with_ids else None, first=True, usage=running_usage(), index=i)
                       for i in range(len(choices))) if parsed.kind == "chat" else b""
    try:
        while left:
            items = [await stream.queue.get()]
            if sent is not None and items[0] is not None and not items[0].finished:
                early = sent + stream_interval(state) - time.monotonic()
                if early > 0:
                    await stream.nap(early)
            items += stream.get_nowait_all()
            if any(item is None for item in items):
                return  # the client has gone
            new: dict[int, list] = {}  # index -> [ids, logprob entries, final delta]
            for delta in items:
                ids, entries, _ = new.setdefault(delta.index, [[], [], None])
                ids += delta.new_token_ids
                entries += delta.logprobs or []
                if delta.finished:
                    new[delta.index][2] = delta
            frames = []
            for index, (ids, entries, final) in new.items():
                choice = choices[index]
                if choice.done:
                    continue
                if final is not None and final.finish_reason == "error":
                    finished = True
                    yield frame(json.dumps(error_body(final.error or "engine error", "server_error", None,
                                                      "engine_error"))) + DONE
                    return
                text, kept, kept_entries = choice.push(ids, entries)
                if choice.answer.stopped:
                    _stop_sample(state, choice)
                elif final is None:
                    if text or kept:  # every token goes out when it comes, even one without text (app.py)
                        frames.append(render.chunk(text, None, kept if with_ids else None, usage=running_usage(),
                                                   index=index, logprobs=choice.rendered_logprobs(kept, kept_entries)))
                    continue
                else:
                    text += choice.answer.flush()
                    choice.reason = finish_reason(final.finish_reason)
                left -= 1
                frames.append(render.chunk(text if (text or parsed.kind == "completion") else None, choice.reason,
                                           kept if with_ids else None, usage=running_usage(), index=index,
                                           logprobs=choice.rendered_logprobs(kept, kept_entries)))
            if not frames:
                continue
            sent = time.monotonic()
            if not left:
                finished = True
                usage = render.usage_chunk(_usage(num_prompt, choices)) if parsed.include_usage else b""
                yield opening + b"".join(frames) + usage + DONE
                return
            yield opening + b"".join(frames)
            opening = b""
    finally:
        state.live_streams -= 1
        if not finished:
            state.loop.abort(stream.request_id)
