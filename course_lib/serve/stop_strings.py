"""Stop strings: the answer ends where its text first contains one, as the OpenAI API does.

The engine knows token ids, not text (a stop string may span tokens, or end inside one), so the
HTTP side watches the decoded text: `AnswerText` turns the engine's token ids into the text a client
may see. The returned text stops before the stop string (or includes it with vLLM's
`include_stop_str_in_output`); the token ids and the usage count run up to and including the token
that completed it, as vLLM reports them; the handler then aborts the request, so the engine stops
spending steps on it.

While streaming, text that might be the beginning of a stop string is held back until the next
tokens decide: a client never sees a stop string, nor half of one. Held text that turns out not to
start a stop string goes out with the next chunk, or at the end of the answer.
"""
from __future__ import annotations

from .protocol import IncrementalDecoder


class StopStrings:
    """Text in, text decided out. `stopped` once a stop string appears."""

    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = stops
        self.include_stop = include_stop
        self.longest = max(len(s) for s in stops)
        self.first_chars = {s[0] for s in stops}
        self.held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """The part of held text + `text` that is decided: up to the first stop string if one has
        appeared (then `stopped`), else everything but a tail that could begin one."""
        if self.stopped or not text:
            return ""
        pending = self.held + text
        # A stop string can only begin inside `pending`: anything before it was decided not to begin one.
        hits = [(i, s) for i, s in ((pending.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, stop = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
            self.stopped, self.held = True, ""
            return pending[:at + len(stop)] if self.include_stop else pending[:at]
        keep = self._undecided_tail(pending)
        self.held = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep]

    def flush(self) -> str:
        """The answer ended without a stop string: what was held back is decided now."""
        text, self.held = self.held, ""
        return text

    def _undecided_tail(self, text: str) -> int:
        """The length of the longest tail of `text` that is the beginning of a stop string."""
        for start in range(max(0, len(text) - self.longest + 1), len(text)):
            if text[start] in self.first_chars:
                tail = text[start:]
                if any(s.startswith(tail) for s in self.stops):
                    return len(text) - start
        return 0


class AnswerText:
    """The engine's token ids in, the client's text out: decoded incrementally and, with stop
    strings, ended at the first one. `num_tokens` counts the ids that belong to the answer."""

    def __init__(self, tokenizer, stops: list[str] = (), include_stop: bool = False, skip_special_tokens: bool = True):
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens)
        self.stops = StopStrings(list(stops), include_stop) if stops else None
        self.num_tokens = 0

    @property
    def stopped(self) -> bool:
        return self.stops is not None and self.stops.stopped

    def push(self, ids: list[int]) -> tuple[str, list[int]]:
        """(the text now decided, the ids of `ids` that belong to the answer). With stop strings the
        ids go one at a time, so that the answer's ids end at the token that completed the stop."""
        if self.stops is None:
            self.num_tokens += len(ids)
            return self.decoder.push(ids), ids
        if self.stops.stopped:
            return "", []
        pieces = []
        for k, token in enumerate(ids):
            pieces.append(self.stops.push(self.decoder.push([token])))
            if self.stops.stopped:
                ids = ids[:k + 1]
                break
        self.num_tokens += len(ids)
        return "".join(pieces), ids

    def flush(self) -> str:
        """The end of an answer that no stop string ended: the text held back."""
        return self.stops.flush() if self.stops is not None else ""
