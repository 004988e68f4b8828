"""CharTokenizer: ids, round trips, clear errors, persistence."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.model.tokenizer import DEFAULT_CHARS, CharTokenizer

tok = CharTokenizer()


def test_special_ids():
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + len(DEFAULT_CHARS)
    assert tok.decode([0, 1, 2], skip_special=False) == "<pad><bos><eos>"
    assert tok.decode([0, 1, 2]) == ""


def test_alphabet_covers_the_tasks():
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789 :=":
        assert len(tok.encode(ch)) == 1
    ids = tok.encode("".join(DEFAULT_CHARS))
    assert sorted(ids) == list(range(3, tok.vocab_size))


@given(st.text(alphabet=DEFAULT_CHARS, max_size=200))
def test_round_trip(text):
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(3 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_bos=True) + [tok.eos_token_id]) == text


@given(st.text(alphabet=DEFAULT_CHARS, max_size=50))
def test_encode_prompt_is_bos_text_separator(text):
    ids = tok.encode_prompt(text)
    assert ids[0] == tok.bos_token_id
    assert ids[-1] == tok.separator_token_id == tok.encode("=")[0]
    assert ids[1:-1] == tok.encode(text)


def test_encode_prompt_example():
    assert tok.decode(tok.encode_prompt("sort: 93127"), skip_special=False) == "<bos>sort: 93127="


@pytest.mark.parametrize("text,bad,pos", [("Hello", "H", 0), ("sort: 12\n", "\n", 8), ("caf\u00e9", "\u00e9", 3)])
def test_unknown_character_is_named(text, bad, pos):
    with pytest.raises(ValueError) as e:
        tok.encode(text)
    msg = str(e.value)
    assert repr(bad) in msg
    assert f"position {pos}" in msg
    assert "abcdefghijklmnopqrstuvwxyz" in msg  # the allowed set is listed


def test_decode_rejects_unknown_ids():
    for bad in (tok.vocab_size, -1, 10_000):
        with pytest.raises(ValueError) as e:
            tok.decode([3, bad])
        assert str(bad) in str(e.value)
        assert f"vocab_size {tok.vocab_size}" in str(e.value)


def test_decode_accepts_tensors_of_ids():
    import torch

    assert tok.decode(torch.tensor(tok.encode("abc"))) == "abc"


def test_save_load(tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    again = CharTokenizer.load(path)
    assert again.vocab_size == tok.vocab_size
    assert again.encode_prompt("reverse: abc") == tok.encode_prompt("reverse: abc")


def test_bad_construction():
    with pytest.raises(ValueError, match="unique"):
        CharTokenizer(chars="aab=")
    with pytest.raises(ValueError, match="separator"):
        CharTokenizer(chars="ab", separator="=")
