"""Benchmark tools work against `course_lib serve` out of the box (issue 25, part 1).

- The tiny model ships a Hugging Face tokenizer folder, generated from CharTokenizer: it loads
  offline with `transformers.AutoTokenizer` and encodes and decodes as CharTokenizer does.
- `serve --served-model-name` (vLLM's flag) names the model, once or several times; /v1/models lists
  every name with the tokenizer folder as `root`; the default name stays "tiny".
- A token that decodes to no text still streams (text "" while its ids advance, as vLLM does), and a
  chat stream's role chunk leaves with the first token, so a client's time to first chunk is the
  time to the first token.
- The openai SDK, as a benchmark client would use it: time to first chunk, and token counts from
  `usage` equal to the shipped tokenizer's; GuideLLM itself when it is installed in BENCH_VENV.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.model.hf_tokenizer import (FILE_NAMES, HF_TOKENIZER_DIR, hf_tokenizer_files, stale_files,
                                           tiny_hf_tokenizer_files, write_hf_tokenizer)
from course_lib.model.tasks import TASK_KINDS, sample_task
from course_lib.model.tokenizer import DEFAULT_CHARS, CharTokenizer
from serve_support import wait_until

ROOT = Path(__file__).resolve().parent.parent
course_tok = CharTokenizer.load(HF_TOKENIZER_DIR.parent / "tokenizer.json")
# GuideLLM lives in a virtual environment of its own (scripts/setup.sh makes .bench-venv).
BENCH_VENV = Path(os.environ.get("BENCH_VENV", ROOT / ".bench-venv"))


@pytest.fixture(scope="module")
def hf_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HF_TOKENIZER_DIR))


# ------------------------------------------------------------------------------ the tokenizer folder
def test_the_shipped_folder_is_what_the_generator_makes_now(tmp_path):
    assert stale_files() == [], "run `python -m course_lib.model.hf_tokenizer` to regenerate the folder"
    assert sorted(p.name for p in HF_TOKENIZER_DIR.iterdir()) == sorted(FILE_NAMES)  # nothing else in it
    assert tiny_hf_tokenizer_files() == tiny_hf_tokenizer_files()  # deterministic
    # ... and small: the whole folder is a few kilobytes
    assert sum((HF_TOKENIZER_DIR / name).stat().st_size for name in FILE_NAMES) < 8_000
    (tmp_path / "tokenizer.json").write_text("{}")
    assert stale_files(tmp_path) == list(FILE_NAMES)  # a stale or missing file is named


def test_the_folder_loads_offline_in_a_fresh_process(tmp_path):
    """No network, an empty Hugging Face cache, another working directory: the path is enough."""
    code = ("from transformers import AutoTokenizer\n"
            f"t = AutoTokenizer.from_pretrained({str(HF_TOKENIZER_DIR)!r})\n"
            "ids = t.encode('sort: 93127')\n"
            "print(ids, repr(t.decode(ids + [t.eos_token_id])), t.bos_token_id, t.eos_token_id, t.pad_token_id)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = course_tok.encode("sort: 93127")
    assert done.stdout.split("\n")[-2] == f"{ids} 'sort: 93127<eos>' 1 2 0"  # decode keeps specials by default


def test_special_tokens_and_vocabulary_are_the_course_tokenizers(hf_tok):
    assert (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2)
    assert (hf_tok.pad_token, hf_tok.bos_token, hf_tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert sorted(hf_tok.all_special_ids) == course_tok.special_token_ids
    assert len(hf_tok) == course_tok.vocab_size == json.loads((HF_TOKENIZER_DIR.parent / "config.json").read_text())[
        "vocab_size"]
    assert hf_tok.convert_ids_to_tokens(list(range(course_tok.vocab_size))) == [
        course_tok.decode([i], skip_special=False) for i in range(course_tok.vocab_size)]


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=DEFAULT_CHARS, max_size=200))
def test_encode_equals_the_course_tokenizer(hf_tok, text):
    expected = course_tok.encode(text)
    assert hf_tok.encode(text) == expected  # nothing added: the server adds <bos> and "=" itself
    assert hf_tok.encode(text, add_special_tokens=False) == expected
    assert hf_tok(text)["input_ids"] == expected


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, course_tok.vocab_size - 1), max_size=100), skip=st.booleans())
def test_decode_equals_the_course_tokenizer_special_tokens_included(hf_tok, ids, skip):
    assert hf_tok.decode(ids, skip_special_tokens=skip) == course_tok.decode(ids, skip_special=skip)


def test_task_prompts_and_answers_round_trip_as_in_the_course(hf_tok):
    rng = random.Random(25)
    for kind in TASK_KINDS:
        for _ in range(40):
            prompt, answer = sample_task(rng, kind)
            assert hf_tok.encode(prompt) == course_tok.encode(prompt), prompt
            assert hf_tok.encode(answer) == course_tok.encode(answer), answer
            # what the model reads and writes: <bos> prompt = answer <eos>
            ids = course_tok.encode_prompt(prompt) + course_tok.encode(answer) + [course_tok.eos_token_id]
            for skip in (True, False):
                assert hf_tok.decode(ids, skip_special_tokens=skip) == course_tok.decode(ids, skip_special=skip)


def test_characters_the_server_refuses_are_dropped_not_invented(hf_tok):
    """A benchmark tool that makes prompts by decoding tokens then sends only text the server takes."""
    text = "Sort: 93127\n\u00e9!"
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        course_tok.encode(text)
    assert hf_tok.encode(text) == course_tok.encode("ort: 93127!")
    assert hf_tok.decode(hf_tok.encode("a , b")) == "a , b"  # no clean-up of spaces before punctuation


def test_the_generator_follows_the_tokenizer_it_is_given(tmp_path):
    """One source of truth: another alphabet gives another folder, equal to its CharTokenizer."""
    from transformers import AutoTokenizer

    other = CharTokenizer(chars="ba=9 ")
    folder = write_hf_tokenizer(tmp_path / "other", other, model_max_length=64)
    assert {p.name: p.read_text() for p in folder.iterdir()} == hf_tokenizer_files(other, 64)
    loaded = AutoTokenizer.from_pretrained(str(folder))
    assert loaded.encode("ab= 9") == other.encode("ab= 9") and loaded.model_max_length == 64
    assert loaded.decode(other.encode_prompt("ab") + [2], skip_special_tokens=False) == "<bos>ab=<eos>"


def test_package_data_ships_the_folder():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["course_lib"]
    for name in FILE_NAMES:
        rel = (HF_TOKENIZER_DIR / name).relative_to(ROOT / "course_lib").as_posix()
        assert any(fnmatch(rel, p) for p in patterns), f"{rel} is not in [tool.setuptools.package-data]"


# ------------------------------------------------------------------------------ --served-model-name
def test_served_model_name_is_vllms_flag_once_or_repeated():
    from course_lib.serve.cli import build_parser

    parser = build_parser()
    default = parser.parse_args([])
    assert default.served_model_name is None and default.served_model_names == []
    for argv in (["--served-model-name", "a", "b"], ["--served-model-name", "a", "--served-model-name", "b", "a"]):
        args = parser.parse_args(argv)
        assert args.served_model_names == ["a", "b"] and args.served_model_name == "a"  # the engine reads the first
    with pytest.raises(SystemExit):
        parser.parse_args(["--served-model-name", " "])


@pytest.fixture(scope="module")
def default_server():
    from course_lib.serve.launch import ServerProcess

    with ServerProcess(["--no-dashboard", "--max-num-seqs", "8"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def tiny():
    from course_lib import load_tiny

    return load_tiny()


@pytest.fixture(scope="module")
def named_server(tiny):
    """What `serve --served-model-name tiny-course --served-model-name course/tiny` builds, in a thread
    (a second server process would cost ~10 s of this machine's two cores)."""
    from course_lib import EngineConfig, LLMEngine
    from course_lib.serve.cli import build_parser, name_model
    from course_lib.serve.launch import ServerThread

    args = build_parser().parse_args(["--served-model-name", "tiny-course", "--served-model-name", "course/tiny"])
    engine = LLMEngine(tiny[0], EngineConfig(max_num_seqs=4))
    with ServerThread(engine, tiny[1], model_name=args.served_model_name, dashboard=False) as srv:
        name_model(srv.state, args)
        yield srv


def test_default_name_stays_tiny_and_models_points_at_the_tokenizer(default_server):
    models = httpx.get(default_server.url + "/v1/models", timeout=30).json()
    assert [card["id"] for card in models["data"]] == ["tiny"]
    card = models["data"][0]
    assert card["root"] == str(HF_TOKENIZER_DIR) and card["max_model_len"] == 256
    assert "tokenizer" in default_server.log_tail() and str(HF_TOKENIZER_DIR) in default_server.log_tail()


def test_every_served_name_is_listed_and_accepted(named_server, hf_tok):
    from transformers import AutoTokenizer

    with httpx.Client(base_url=named_server.url, timeout=30) as client:
        cards = client.get("/v1/models").json()["data"]
        assert [card["id"] for card in cards] == ["tiny-course", "course/tiny"]
        assert {card["root"] for card in cards} == {str(HF_TOKENIZER_DIR)}
        tok = AutoTokenizer.from_pretrained(cards[0]["root"])  # what a tool does with it
        assert tok.encode("max: 38152") == hf_tok.encode("max: 38152")
        for name in ("tiny-course", "course/tiny"):
            r = client.post("/v1/completions", json={"model": name, "prompt": "sort: 93127", "max_tokens": 8,
                                                     "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == "tiny-course"  # answers carry the first name, as vLLM's do
            assert r.json()["choices"][0]["text"] == "12379"
        r = client.post("/v1/chat/completions", json={"model": "course/tiny", "temperature": 0,
                                                      "messages": [{"role": "user", "content": "sort: 93127"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "12379"
        for other in ("tiny", "TINY-COURSE", ["tiny-course"]):
            r = client.post("/v1/completions", json={"model": other, "prompt": "sort: 1", "max_tokens": 2})
            assert r.status_code == 404, (other, r.text)
            assert "'tiny-course' or 'course/tiny'" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------ tokens without text
@pytest.fixture(scope="module")
def thread_server(tiny):
    from course_lib import EngineConfig, LLMEngine
    from course_lib.serve.launch import ServerThread

    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=4)), tokenizer, dashboard=False) as srv:
        yield srv


def _stream_in_background(url: str, path: str, body: dict):
    """Reads an SSE response in a thread: (events as (monotonic time, parsed data), the thread)."""
    events: list = []

    def read():
        with httpx.Client(timeout=60) as client, client.stream("POST", url + path, json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    events.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return events, thread


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_the_first_token_streams_at_once_even_without_text(thread_server, kind):
    """The tiny model answers "x" with EOS after EOS (no text under ignore_eos). Paused, the engine
    computes nothing and the client hears nothing, not even the chat role; after one step, one token
    exists and the client has its chunk: text "", ids advancing."""
    loop = thread_server.loop
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    body = {"max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **({"prompt": "x"} if kind == "completion" else {"messages": [{"role": "user", "content": "x"}]})}
    loop.submit(lambda: loop.pause(True))
    try:
        events, reader = _stream_in_background(thread_server.url, path, body)
        wait_until(lambda: loop.engine.has_unfinished_requests, 10, "the request to reach the engine")
        time.sleep(0.3)
        assert events == [], "a chunk went out before the engine computed any token"
        loop.submit(loop.single_step)
        wait_until(lambda: events, 10, "the first token's chunk")
        time.sleep(0.1)
        first = [data for _, data in events]
        assert first[-1]["usage"]["completion_tokens"] == 1, first  # one step, one token: an EOS
        token_chunk = first[-1]["choices"][0]
        assert token_chunk["finish_reason"] is None and "token_ids" not in token_chunk
        assert (token_chunk["text"] if kind == "completion" else token_chunk["delta"]) in ("", {"content": ""})
        if kind == "chat":  # the role leaves with the first token, in the same write
            assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and len(first) == 2
    finally:
        loop.submit(lambda: loop.pause(False))
    reader.join(30)
    data = [d for _, d in events]
    assert data[-1] == "[DONE]" and data[-2]["usage"]["completion_tokens"] == 24
    assert data[-3]["choices"][0]["finish_reason"] == "length"


def test_without_token_ids_empty_text_still_streams_as_chunks(thread_server):
    """Every token of the answer comes before the end, not only in the last chunk: without
    return_token_ids an empty-text chunk is `"text": ""`, as vLLM sends it."""
    body = {"prompt": "x", "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events, reader = _stream_in_background(thread_server.url, "/v1/completions", body)
    reader.join(60)
    data = [d for _, d in events]
    assert data[-1] == "[DONE]"
    chunks = data[:-2]
    assert len(chunks) >= 2 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["text"] == "" and "token_ids" not in c["choices"][0] for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[0] < 48 == counts[-1]


# ------------------------------------------------------------------------------ benchmark clients
def test_openai_sdk_ttft_is_the_first_chunk_and_usage_matches_the_tokenizer(default_server, hf_tok):
    import openai

    client = openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    card = client.models.list().data[0]
    assert card.id == "tiny" and card.model_extra["root"] == str(HF_TOKENIZER_DIR)

    prompt = "countdown: 12"
    chunks, times = [], []
    start = time.monotonic()
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"return_token_ids": True}):
        chunks.append(chunk)
        times.append(time.monotonic() - start)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    usage = chunks[-1].usage
    assert text == "12 11 10 9 8 7 6 5 4 3 2 1 0"
    # A benchmark client counts tokens with the shipped tokenizer: the answer's text, plus its EOS ...
    assert ids == hf_tok.encode(text) + [hf_tok.eos_token_id] and usage.completion_tokens == len(ids)
    # ... and the prompt: <bos> + text + "=", the 2 tokens the server adds to every text prompt.
    assert usage.prompt_tokens == len(hf_tok.encode(prompt)) + 2

    # Time to first token is the time to the first chunk, also when the first tokens have no text.
    chunks, times = [], []
    start = time.monotonic()
    for chunk in client.completions.create(model="tiny", prompt="x", max_tokens=64, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}):
        chunks.append(chunk)
        times.append(time.monotonic() - start)
    assert len(chunks) >= 2 and chunks[0].choices[0].text == "" and chunks[0].choices[0].finish_reason is None
    assert times[0] < times[-1]

    # Chat: the first chunk (the role) comes with the first token.
    chat = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "sort: 93127"}],
                                               temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chat[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == "12379"
    assert chat[-1].usage.completion_tokens == len(hf_tok.encode("12379")) + 1


@pytest.fixture(scope="module")
def guidellm():
    """The guidellm command of BENCH_VENV; skips (before any server starts) where it is not installed."""
    python = BENCH_VENV / "bin" / "python"
    if not python.is_file() or subprocess.run([str(python), "-c", "import guidellm"],
                                              capture_output=True).returncode != 0:
        why = f"guidellm is not installed in {BENCH_VENV} (scripts/setup.sh installs it; README: Benchmark with GuideLLM)"
        if os.environ.get("CI"):  # CI ran setup.sh: a missing client is a broken setup, not a reason to skip
            pytest.fail(why)
        pytest.skip(why)
    return BENCH_VENV / "bin" / "guidellm"


@pytest.mark.slow
def test_guidellm_benchmarks_the_server_with_the_shipped_tokenizer(guidellm, default_server, tmp_path):
    out = tmp_path / "guidellm.json"
    requests, prompt_tokens, output_tokens = 4, 16, 8
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cmd = [str(guidellm), "run",
           "--backend", f"kind=openai_http,target={default_server.url}",
           "--tokenizer", f"kind=huggingface_auto,model={HF_TOKENIZER_DIR}",
           "--profile", "kind=synchronous",
           "--constraint", f"kind=max_requests,count={requests}",
           "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    done = subprocess.run(cmd, cwd=tmp_path, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    totals = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    assert totals["request_totals"]["successful"] == requests and totals["request_totals"]["errored"] == 0
    # GuideLLM counts from the server's usage: prompts of 16 tokens by the shipped tokenizer are 16 + 2
    # (<bos> and "=") to the server; outputs are exactly output_tokens (GuideLLM sends ignore_eos).
    assert totals["prompt_token_count"]["successful"]["total_sum"] == requests * (prompt_tokens + 2)
    assert totals["output_token_count"]["successful"]["total_sum"] == requests * output_tokens
