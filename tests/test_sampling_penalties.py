"""Penalties, min_tokens, logit_bias and skip_special_tokens, as vLLM defines them: the logits
transform on hand-computed numbers, the engine against a dense greedy loop that applies the same
rules written out here, the effect each one has on the tiny model's answers, and the server's
answer equal to the in-process engine's with the same parameters."""
from __future__ import annotations

import json
import math

import pytest
import torch

from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny
from course_lib.logit_adjust import adjust_logits
from course_lib.sampler import sample

EOS = 2


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


# ------------------------------------------------------------------------------------ the transform
def _row():
    return torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 0.5, -0.5, 2.0], dtype=torch.float64)


def test_presence_and_frequency_penalties_subtract_from_generated_tokens_only():
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = adjust_logits(_row(), p, prompt_ids=[0, 1], output_ids=[4, 4, 6])
    want = _row()
    want[4] -= 2 * 0.25 + 0.5  # generated twice
    want[6] -= 0.25 + 0.5  # once
    assert torch.equal(out, want)  # prompt tokens 0 and 1 are not penalised


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    p = SamplingParams(repetition_penalty=2.0)
    out = adjust_logits(_row(), p, prompt_ids=[0, 1], output_ids=[4, 6])
    want = _row()
    want[0], want[1], want[4], want[6] = 0.5, -4.0, 2.5, -1.0
    assert torch.equal(out, want)


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    p = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=[5])
    early = adjust_logits(_row(), p, [0], [7], eos_token_ids=[EOS])
    assert early[EOS] == -math.inf and early[5] == -math.inf
    assert torch.equal(early[[0, 1, 3, 4, 6, 7]], _row()[[0, 1, 3, 4, 6, 7]])
    assert torch.equal(adjust_logits(_row(), p, [0], [7, 7], eos_token_ids=[EOS]), _row())  # reached
    ignoring = adjust_logits(_row(), SamplingParams(max_tokens=8, min_tokens=2, ignore_eos=True), [0], [],
                             eos_token_ids=[EOS])
    assert ignoring[EOS] == _row()[EOS]  # EOS ends nothing under ignore_eos: nothing to hold back


def test_logit_bias_adds_to_the_listed_tokens():
    out = adjust_logits(_row(), SamplingParams(logit_bias={1: 100, 3: -0.5}), [0], [])
    want = _row()
    want[1] += 100
    want[3] -= 0.5
    assert torch.equal(out, want)


def test_neutral_requests_never_reach_the_transform(monkeypatch):
    """All neutral: nothing is applied (no copy, no history needed), so greedy parity is untouched."""
    def boom(*args):
        raise AssertionError("a neutral request was adjusted")

    monkeypatch.setattr("course_lib.sampler.adjust_logits", boom)
    logits = torch.randn(3, 8)
    neutral = SamplingParams(presence_penalty=0, frequency_penalty=0.0, repetition_penalty=1, min_tokens=0,
                             logit_bias={})
    assert not neutral.adjusts_logits
    assert sample(logits, [neutral] * 3, [None] * 3) == logits.argmax(-1).tolist()
    neutral.frequency_penalty = 1.0  # a change after construction is seen, never silently skipped
    assert neutral.adjusts_logits


def test_sample_adjusts_only_the_rows_that_ask():
    logits = torch.zeros(2, 8)
    logits[:, 3] = 1.0
    biased = SamplingParams(logit_bias={5: 10})
    tokens = sample(logits, [SamplingParams(), biased], [None, None], [None, ([0], [])])
    assert tokens == [3, 5]
    with pytest.raises(ValueError, match="prompt ids, output ids"):
        sample(logits, [biased], [None])


@pytest.mark.parametrize("kwargs,needle", [
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
    ({"min_tokens": 17}, "min_tokens must be an integer in [0, max_tokens = 16]"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"logit_bias": {3: 101}}, "logit_bias of token 3 must be in [-100, 100]"),
    ({"logit_bias": {-1: 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": [1]}, "logit_bias must be a dict"),
])
def test_bad_values_name_the_field_and_the_limit(kwargs, needle):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert needle in str(err.value)


def test_the_engine_refuses_a_bias_outside_the_vocabulary(tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, EngineConfig())
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"logit_bias has token ids outside the vocabulary \[0, {vocab}\)"):
        engine.add_request(tokenizer.encode_prompt("sort: 1"), SamplingParams(logit_bias={vocab: 1}))


# ------------------------------------------------------------------------------------ the engine
def _reference(model, prompt, p: SamplingParams) -> list[int]:
    """Greedy decoding over the dense model, with vLLM's rules written out token by token."""
    eos = set(model.config.eos_token_ids)
    seq, out = list(prompt), []
    while len(out) < p.max_tokens:
        logits = [float(x) for x in model.dense_logits([seq])[0][-1]]
        for t in range(len(logits)):
            if len(out) < p.min_tokens and (t in p.stop_token_ids or (t in eos and not p.ignore_eos)):
                logits[t] = -math.inf
            logits[t] += (p.logit_bias or {}).get(t, 0.0)
            if t in seq:
                logits[t] = logits[t] / p.repetition_penalty if logits[t] > 0 else logits[t] * p.repetition_penalty
            if t in out:
                logits[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
        token = max(range(len(logits)), key=logits.__getitem__)
        out.append(token)
        seq.append(token)
        if token in p.stop_token_ids or (token in eos and not p.ignore_eos):
            break
    return out


def _cases(tokenizer):
    x = tokenizer.encode("x")[0]
    return [
        ("countdown: 12", SamplingParams(max_tokens=40, frequency_penalty=2.0)),
        ("countdown: 12", SamplingParams(max_tokens=40, presence_penalty=1.5, frequency_penalty=0.5)),
        ("countdown: 12", SamplingParams(max_tokens=40, repetition_penalty=2.0)),
        ("reverse: 58213", SamplingParams(max_tokens=30, min_tokens=12)),
        ("sort: 93127", SamplingParams(max_tokens=20, logit_bias={x: 100})),
        ("sort: 93127", SamplingParams(max_tokens=20)),  # a neutral neighbour in the same batch
    ]


@pytest.mark.parametrize("cfg", [{}, {"page_size": 4, "enable_prefix_caching": True},
                                 {"page_size": 4, "num_pages": 24, "max_num_batched_tokens": 16}],
                         ids=["default", "prefix-caching", "small-pool-chunked"])
def test_engine_equals_the_dense_reference_with_the_same_rules(tiny, cfg):
    model, tokenizer = tiny
    cases = _cases(tokenizer)
    prompts = [tokenizer.encode_prompt(text) for text, _ in cases]
    params = [p for _, p in cases]
    got = [o.token_ids for o in LLMEngine(model, EngineConfig(**cfg)).generate(prompts, params)]
    assert got == [_reference(model, prompt, p) for prompt, p in zip(prompts, params)]


def _answer(tiny, text, **kwargs):
    model, tokenizer = tiny
    (out,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(text)],
                                                      SamplingParams(max_tokens=40, **kwargs))
    return out.token_ids


def test_frequency_penalty_stops_the_answer_repeating_itself(tiny):
    plain, penalised = _answer(tiny, "countdown: 12"), _answer(tiny, "countdown: 12", frequency_penalty=2.0)
    most = lambda ids: max(ids.count(t) for t in set(ids))  # noqa: E731
    assert most(penalised) < most(plain), (plain, penalised)
    assert _answer(tiny, "countdown: 12", presence_penalty=2.0, frequency_penalty=2.0) != plain


def test_repetition_penalty_changes_a_repetitive_answer(tiny):
    assert _answer(tiny, "countdown: 12", repetition_penalty=2.0) != _answer(tiny, "countdown: 12")


def test_min_tokens_delays_eos(tiny):
    plain = _answer(tiny, "reverse: 58213")
    assert plain[-1] == EOS and len(plain) < 12
    longer = _answer(tiny, "reverse: 58213", min_tokens=12)
    assert len(longer) >= 12 and EOS not in longer[:12]
    assert longer[:len(plain) - 1] == plain[:-1]  # the same answer until the EOS it could not say


def test_logit_bias_forces_and_forbids_tokens(tiny):
    x = tiny[1].encode("x")[0]
    assert _answer(tiny, "sort: 93127", logit_bias={x: 100}) == [x] * 40
    plain = _answer(tiny, "sort: 93127")
    assert _answer(tiny, "sort: 93127", logit_bias={plain[0]: -100})[0] != plain[0]


# ------------------------------------------------------------------------------------ the server
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")


@pytest.fixture(scope="module")
def client(tiny):
    from course_lib.serve.launch import ServerThread

    model, tokenizer = tiny
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=16)), tokenizer) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            yield c


SERVED = [
    ("countdown: 12", {"frequency_penalty": 2.0}),
    ("countdown: 12", {"presence_penalty": 1.5, "frequency_penalty": -0.5}),
    ("countdown: 12", {"repetition_penalty": 2.0}),
    ("reverse: 58213", {"min_tokens": 12}),
    ("sort: 93127", {"logit_bias": {"27": 100}}),
    ("countdown: 12", {"temperature": 1.0, "seed": 7, "frequency_penalty": 1.0, "repetition_penalty": 1.3,
                       "logit_bias": {"2": -5}}),
]


@pytest.mark.parametrize("text,fields", SERVED, ids=[str(f)[:50] for _, f in SERVED])
def test_the_server_answers_what_the_engine_answers(client, tiny, text, fields):
    model, tokenizer = tiny
    engine_fields = {**fields, "temperature": fields.get("temperature", 0.0)}
    if "logit_bias" in fields:
        engine_fields["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
    (want,) = LLMEngine(model, EngineConfig()).generate([tokenizer.encode_prompt(text)],
                                                       SamplingParams(max_tokens=30, **engine_fields))
    for path, body in [("/v1/completions", {"prompt": text}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})]:
        r = client.post(path, json={**body, "max_tokens": 30, "temperature": 0, "return_token_ids": True, **fields})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == want.token_ids
        text_out = choice["text"] if "text" in choice else choice["message"]["content"]
        assert text_out == tokenizer.decode(want.token_ids)


def test_skip_special_tokens_false_keeps_eos_in_the_text(client, tiny):
    tokenizer = tiny[1]
    body = {"prompt": "reverse: 58213", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    kept = client.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()["choices"][0]
    skipped = client.post("/v1/completions", json=body).json()["choices"][0]
    assert kept["token_ids"] == skipped["token_ids"] and EOS in kept["token_ids"]
    assert "<eos>" in kept["text"] and kept["text"] == tokenizer.decode(kept["token_ids"], skip_special=False)
    assert "<eos>" not in skipped["text"] and skipped["text"] == tokenizer.decode(kept["token_ids"])
    with client.stream("POST", "/v1/completions", json={**body, "skip_special_tokens": False, "stream": True}) as r:
        chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert streamed == kept["text"]


@pytest.mark.parametrize("fields,needle", [
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2.0, 2.0]"),
    ({"frequency_penalty": "1"}, "frequency_penalty must be a number"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in (0.0, inf]"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens must be in [0, 10]"),
    ({"logit_bias": {"5": 101}}, "logit_bias of token 5 must be a number in [-100, 100]"),
    ({"logit_bias": {"five": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {"100000": 1}}, "logit_bias has token ids outside the vocabulary"),
    ({"logit_bias": [5]}, "logit_bias must be an object"),
    ({"skip_special_tokens": 0}, "skip_special_tokens must be true or false"),
])
def test_bad_values_are_400s_naming_the_field(client, fields, needle):
    r = client.post("/v1/completions", json={"prompt": "reverse: 1", "max_tokens": 10, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == next(iter(fields)) and needle in error["message"], error
