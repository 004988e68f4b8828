"""The tiny model's tokenizer as a Hugging Face tokenizer folder, for tools that load one by path.

Benchmark clients (GuideLLM, AIPerf, `vllm bench`) build and count prompts with
`transformers.AutoTokenizer.from_pretrained(...)`. "tiny" is no Hugging Face id, so the package
ships this folder next to the tiny model (`HF_TOKENIZER_DIR`), and `serve` names it in
/v1/models (`root`, as vLLM does). It is generated from `CharTokenizer`, the one source of truth:
`python -m course_lib.model.hf_tokenizer` rewrites it, and a test holds the shipped files equal to
what this module makes now. Only `json` is needed to write it; `transformers` only to read it.

What it does, in Hugging Face's terms:

- the vocabulary is CharTokenizer's: `<pad>`, `<bos>`, `<eos>` (ids 0-2, special tokens), then one
  id per character, in the same order; a BPE model with no merges, so each character is a token;
- `encode(text)` is `CharTokenizer.encode(text)`, with or without `add_special_tokens` (nothing is
  added). The server reads a text prompt as `encode_prompt(text)` = `<bos>` + text + "=", so a
  request's `usage.prompt_tokens` is this count + 2;
- a character outside the alphabet is dropped (there is no unknown token) where course_lib refuses
  it with a 400: a tool that makes its prompts by decoding tokens sends only text the server takes;
- `decode(ids, skip_special_tokens=s)` is `CharTokenizer.decode(ids, skip_special=s)`: the
  characters joined with nothing between them (a Fuse decoder), special tokens as "<eos>" or left
  out, and no clean-up of spaces before punctuation (" ," stays " ,");
- no chat template: the server's chat prompt for the tiny model is its last user message (see
  course_lib/serve/protocol.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .tokenizer import CharTokenizer

TINY_DIR = Path(__file__).resolve().parent / "tiny"  # as tiny.py has it (which would import torch)
HF_TOKENIZER_DIR = TINY_DIR / "hf_tokenizer"
FILE_NAMES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_json(tokenizer: CharTokenizer) -> dict:
    """The `tokenizers` library's serialized form (tokenizer.json) of `tokenizer`."""
    # Each id's token as CharTokenizer itself spells it: the ids cannot drift apart.
    vocab = {tokenizer.decode([i], skip_special=False): i for i in range(tokenizer.vocab_size)}
    specials = [{"id": i, "content": tokenizer.decode([i], skip_special=False), "single_word": False,
                 "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                for i in tokenizer.special_token_ids]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,  # encode adds nothing: the server adds <bos> and "=" itself
        "decoder": {"type": "Fuse"},  # join tokens with nothing between them (the default joins with spaces)
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config(tokenizer: CharTokenizer, model_max_length: int) -> dict:
    """tokenizer_config.json: which class reads tokenizer.json, the special tokens, the context."""
    pad, bos, eos = (tokenizer.decode([i], skip_special=False)
                     for i in (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id))
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # else decode would turn "a , b" into "a, b"
        "model_input_names": ["input_ids", "attention_mask"],
    }


def hf_tokenizer_files(tokenizer: CharTokenizer, model_max_length: int) -> dict[str, str]:
    """{file name: text} of the folder: the same text for the same tokenizer, every time."""
    def dump(obj: dict) -> str:
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"

    return {"tokenizer.json": dump(tokenizer_json(tokenizer)),
            "tokenizer_config.json": dump(tokenizer_config(tokenizer, model_max_length))}


def write_hf_tokenizer(folder: str | Path, tokenizer: CharTokenizer, model_max_length: int) -> Path:
    """Writes the folder for `tokenizer` (a model whose context is `model_max_length` tokens)."""
    return _write(folder, hf_tokenizer_files(tokenizer, model_max_length))


def _write(folder: str | Path, files: dict[str, str]) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def tiny_hf_tokenizer_files() -> dict[str, str]:
    """What the shipped folder must hold now: made from the tiny model's own tokenizer and context."""
    from .config import ModelConfig

    config = ModelConfig.load(TINY_DIR / "config.json")
    return hf_tokenizer_files(CharTokenizer.load(TINY_DIR / "tokenizer.json"), config.max_position_embeddings)


def stale_files(folder: str | Path = HF_TOKENIZER_DIR) -> list[str]:
    """The files of `folder` that differ from (or lack) what the generator makes now."""
    folder = Path(folder)
    return [name for name, text in tiny_hf_tokenizer_files().items()
            if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.model.hf_tokenizer",
                                     description="Write the tiny model's Hugging Face tokenizer folder.")
    parser.add_argument("--out", default=str(HF_TOKENIZER_DIR), help="the folder to write")
    parser.add_argument("--check", action="store_true", help="only say whether the folder is up to date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        print(f"{args.out}: {'stale: ' + ', '.join(stale) if stale else 'up to date'}")
        return 1 if stale else 0
    folder = _write(args.out, tiny_hf_tokenizer_files())
    print(f"wrote {', '.join(FILE_NAMES)} to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
