"""Prompt-lookup drafting (n-gram matching, no model): if the request's last n tokens appeared
before in its prompt or output, guess that what followed them then follows them now.

Tasks that copy from the prompt (repeat, spell, reverse) hit often; free-form text rarely. Each
request keeps an index from every n-gram it has seen (n = 1 .. max_n) to where it first and last ended,
updated with the tokens added since the last step, so a proposal costs O(new tokens), not a scan
of the whole sequence.
"""
from __future__ import annotations


class NgramDrafter:
    kind = "ngram"

    def __init__(self, num_speculative_tokens: int, max_n: int = 3, min_n: int = 1):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.k, self.max_n, self.min_n = num_speculative_tokens, max_n, min_n
        # request id -> (tokens indexed so far, {n-gram: (index of the token after its first occurrence, ... after its latest)})
        self._index: dict[str, tuple[int, dict]] = {}

    def propose(self, requests, limits) -> dict:
        """{request id: (draft tokens, None)} for each request (with at most `limits[i]` drafts) that
        has a match; None: the drafts are certain guesses (a point mass for the rejection rule)."""
        drafts = {}
        for request, limit in zip(requests, limits):
            tokens = request.prompt_token_ids + request.output_token_ids
            guess = self._lookup(request.request_id, tokens, min(limit, self.k))
            if guess:
                drafts[request.request_id] = (guess, None)
        return drafts

    def _lookup(self, rid: str, tokens: list[int], k: int) -> list[int]:
        done, index = self._index.get(rid, (0, {}))
        # Index every n-gram that now has a token after it: those ending before the last token.
        last = len(tokens) - 1
        for end in range(max(done, 1), last + 1):  # the n-gram tokens[end - n: end] is followed by tokens[end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(tokens[end - n: end])
                seen = index.get(key)
                index[key] = (end, end) if seen is None else (seen[0], end)
        self._index[rid] = (last + 1, index)
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):  # the longest match first
            seen = index.get(tuple(tokens[len(tokens) - n:]))
            if seen is not None:
                first, latest = seen
                # The latest occurrence is the likeliest guess, but in a repeating run ("3 3 3 3") it ends
                # right before the request's own suffix and leaves fewer than k tokens: take the first then.
                guess = tokens[latest: latest + k]
                return guess if len(guess) == k else tokens[first: first + k]
        return []

    def forget(self, request_ids) -> None:
        """Drop the index of requests that are gone."""
        for rid in request_ids:
            self._index.pop(rid, None)
