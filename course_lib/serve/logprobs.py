"""Log-probabilities in OpenAI's two shapes, from the engine's (logprob, ((id, logprob), ...)) per token.

- completions (the legacy shape): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
  entry per token; `top_logprobs[i]` maps token text to logprob for the sampled token and the k most
  likely (as vLLM fills it); `text_offset[i]` is where token i's text begins in the choice's text;
- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.

A token's text is its own decoding, special tokens included (`<eos>`), as vLLM shows it.
"""
from __future__ import annotations


def token_text(tokenizer, token_id: int) -> str:
    if hasattr(tokenizer, "encode_prompt"):  # the tiny model's character tokenizer
        return tokenizer.decode([token_id], skip_special=False)
    return tokenizer.decode([token_id], skip_special_tokens=False)


class CompletionLogprobs:
    """The completions shape, built chunk by chunk: `offset` runs on across a stream's chunks."""

    def __init__(self, tokenizer, offset: int = 0):
        self.tokenizer, self.offset = tokenizer, offset

    def render(self, ids: list[int], entries: list) -> dict:
        text = lambda t: token_text(self.tokenizer, t)  # noqa: E731
        tokens, offsets, tops = [], [], []
        for token, (_, top) in zip(ids, entries):
            piece = text(token)
            tokens.append(piece)
            offsets.append(self.offset)
            self.offset += len(piece)
            tops.append({text(t): lp for t, lp in top} | {piece: entries[len(tops)][0]})
        return {"tokens": tokens, "token_logprobs": [lp for lp, _ in entries[:len(ids)]], "top_logprobs": tops,
                "text_offset": offsets}


def chat_logprobs(tokenizer, ids: list[int], entries: list) -> dict:
    def item(token: int, logprob: float) -> dict:
        piece = token_text(tokenizer, token)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

    return {"content": [{**item(token, lp), "top_logprobs": [item(t, v) for t, v in top]}
                        for token, (lp, top) in zip(ids, entries)]}
