"""A character-level tokenizer: one id per character, plus PAD, BOS and EOS.

The tiny model reads `<bos>` + the prompt's characters + a separator ("=") and answers with
characters followed by `<eos>`. `encode_prompt` builds exactly that input, so the engine can
feed it to the model as is and stop on `eos_token_id`.
"""
from __future__ import annotations

import json
from pathlib import Path

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
# Everything the tasks write, plus a little punctuation so ordinary prompts still encode.
DEFAULT_CHARS = " abcdefghijklmnopqrstuvwxyz0123456789:=,.-?!"
DEFAULT_SEPARATOR = "="


class CharTokenizer:
    """Ids 0..2 are PAD, BOS, EOS; each allowed character has the next id, in `chars` order."""

    def __init__(self, chars: str = DEFAULT_CHARS, separator: str = DEFAULT_SEPARATOR):
        if len(set(chars)) != len(chars):
            raise ValueError(f"tokenizer characters must be unique, got {chars!r}")
        if separator not in chars:
            raise ValueError(f"separator {separator!r} must be one of the characters {chars!r}")
        self.chars = chars
        self.separator = separator
        self._id_of = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}
        self._token_of = list(SPECIAL_TOKENS) + list(chars)

    # ------------------------------------------------------------------ ids
    @property
    def vocab_size(self) -> int:
        return len(self._token_of)

    @property
    def pad_token_id(self) -> int:
        return 0

    @property
    def bos_token_id(self) -> int:
        return 1

    @property
    def eos_token_id(self) -> int:
        return 2

    @property
    def separator_token_id(self) -> int:
        return self._id_of[self.separator]

    @property
    def special_token_ids(self) -> list[int]:
        return [self.pad_token_id, self.bos_token_id, self.eos_token_id]

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [self.bos_token_id] if add_bos else []
        for pos, ch in enumerate(text):
            tid = self._id_of.get(ch)
            if tid is None:
                raise ValueError(
                    f"character {ch!r} at position {pos} is not in the tokenizer's vocabulary; "
                    f"allowed characters are {self.describe_alphabet()}"
                )
            ids.append(tid)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """What the model expects before it answers: <bos> + text + separator."""
        return self.encode(text, add_bos=True) + [self.separator_token_id]

    def decode(self, ids, skip_special: bool = True) -> str:
        out = []
        for tid in ids:
            tid = int(tid)
            if not 0 <= tid < self.vocab_size:
                raise ValueError(
                    f"token id {tid} is outside the vocabulary (vocab_size {self.vocab_size}, "
                    f"valid ids 0..{self.vocab_size - 1})"
                )
            if tid < len(SPECIAL_TOKENS) and skip_special:
                continue
            out.append(self._token_of[tid])
        return "".join(out)

    def describe_alphabet(self) -> str:
        return f"the {len(self.chars)} characters {self.chars!r}"

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "type": "CharTokenizer",
            "special_tokens": {"pad": [PAD, 0], "bos": [BOS, 1], "eos": [EOS, 2]},
            "chars": self.chars,
            "separator": self.separator,
            "vocab_size": self.vocab_size,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        data = json.loads(Path(path).read_text())
        if data.get("type") != "CharTokenizer":
            raise ValueError(f"{path} is not a CharTokenizer file (type={data.get('type')!r})")
        return cls(chars=data["chars"], separator=data["separator"])

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, separator={self.separator!r})"
