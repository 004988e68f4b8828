"""`serve --speculative ngram|draft --num-speculative-tokens K --draft-layers L`: the flags reach the
engine (in its own process, as `python -m course_lib serve` runs it), bad values stop the command
with an error naming the limit, the answers are the engine's without speculation, and /metrics
counts drafts under vLLM's spec-decode names (course_lib/serve/metrics.py, docs/metrics.md)."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny  # noqa: E402
from course_lib.serve.cli import build_parser, config_flags, engine_config_from_args, main  # noqa: E402
from course_lib.serve.launch import ServerProcess  # noqa: E402

# vLLM's spec-decode counters (its SpecDecodingProm), as scraped: `_total` samples, and a `position`
# label ("0" .. "K-1") on the per-position one. Written out here: the test's own spec.
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos")
# "repeat" and "countdown" answers repeat what came before (n-gram lookup finds it), "spell" answers
# are what the model's first layers already guess: each drafter keeps some drafts on these.
PROMPTS = ["repeat: e 19", "countdown: 36", "spell: 582", "sort: 796810345"]


def scrape(client) -> tuple[dict, float]:
    """{(family, position or None): value} of the spec-decode counters in /metrics (each family's type
    and labels checked), and vllm:generation_tokens_total."""
    found, generated = {}, None
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name == "vllm:generation_tokens":
            generated = family.samples[0].value
        if not family.name.startswith("vllm:spec_decode") or family.name.endswith("_created"):  # (timestamps)
            continue
        assert family.type == "counter", (family.name, family.type)
        for s in family.samples:
            if s.name == family.name + "_total":
                assert s.labels["model_name"] == "tiny" and s.labels["engine"] == "0", s
                found[(family.name, s.labels.get("position"))] = s.value
    return found, generated


def test_the_flags_build_the_engine_config_and_config_flags_gives_them_back():
    args = build_parser().parse_args(["--speculative", "draft", "--num-speculative-tokens", "5",
                                      "--draft-layers", "2"])
    config = engine_config_from_args(args)
    assert (config.speculative, config.num_speculative_tokens, config.draft_layers) == ("draft", 5, 2)
    assert engine_config_from_args(build_parser().parse_args(config_flags(config))) == config
    assert engine_config_from_args(build_parser().parse_args([])).speculative == "none"


BAD = [
    (["--speculative", "eagle"], "invalid choice: 'eagle'"),
    (["--num-speculative-tokens", "0"], "--num-speculative-tokens must be >= 1, got 0"),
    (["--num-speculative-tokens", "-3"], "--num-speculative-tokens must be >= 1, got -3"),
    # the engine's own checks (the tiny model has 4 layers: a draft model is 1 to 3 of them)
    (["--speculative", "draft", "--draft-layers", "4"], "draft_layers must be between 1 and 3"),
    (["--speculative", "draft", "--draft-layers", "0"], "draft_layers must be between 1 and 3"),
    (["--speculative", "ngram", "--scheduler", "static"], "needs ContinuousScheduler"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(argv) for argv, _ in BAD])
def test_bad_speculative_flags_stop_the_command_naming_the_limit(monkeypatch, capsys, argv, needle):
    # --engine-thread builds the engine in this process: its refusals reach the command line as the
    # engine process's do (test_serve_engine_process.py). A server that starts anyway fails the test.
    def served(*_, **__):
        raise AssertionError(f"serve {argv} started a server")

    monkeypatch.setattr("course_lib.serve.launch.serve_forever", served)
    threads = torch.get_num_threads()  # building the engine sets them (--threads)
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["--engine-thread", "--no-dashboard", "--port", "0", *argv])
    finally:
        torch.set_num_threads(threads)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err
    if "eagle" in argv:  # the choices the flag takes are listed
        assert all(f"'{name}'" in err for name in ("none", "ngram", "draft")), err


@pytest.mark.parametrize("flags,k", [
    (["--speculative", "ngram", "--num-speculative-tokens", "2"], 2),
    (["--speculative", "draft", "--num-speculative-tokens", "3", "--draft-layers", "2"], 3),
], ids=["ngram", "draft"])
def test_the_flags_reach_the_engine_process_and_metrics_count_its_drafts(flags, k):
    model, tokenizer = load_tiny(dtype=torch.float64)
    expected = LLMEngine(model, EngineConfig()).generate(  # without speculation
        [tokenizer.encode_prompt(p) for p in PROMPTS], SamplingParams(max_tokens=40))
    with ServerProcess(["--dtype", "float64", "--max-num-seqs", "4", "--no-dashboard", *flags]) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        before, generated_before = scrape(c)
        answers = [c.post("/v1/completions", json={"prompt": p, "max_tokens": 40, "temperature": 0,
                                                   "return_token_ids": True}).json() for p in PROMPTS]
        after, generated_after = scrape(c)
    # K reached the engine: a per-position series for each of its K positions, there from the start
    assert sorted(p for name, p in before if name == PER_POSITION) == [str(i) for i in range(k)]
    assert {name for name, _ in before} == set(SPEC_COUNTERS)
    assert all(v == 0 for v in before.values()), before
    assert [a["choices"][0]["token_ids"] for a in answers] == [o.token_ids for o in expected]

    drafts, draft_tokens, accepted = (after[(name, None)] for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED))
    per_position = [after[(PER_POSITION, str(i))] for i in range(k)]
    # the drafter reached the engine: it drafted, and the target kept some
    assert drafts > 0 and accepted > 0, after
    assert drafts <= draft_tokens <= k * drafts  # 1 to K drafts a row
    assert accepted <= draft_tokens
    assert sum(per_position) == accepted  # each accepted draft counted at its position
    assert per_position == sorted(per_position, reverse=True)  # position i + 1 kept only after i
    assert per_position[0] <= drafts
    # a step that keeps drafts gives several tokens: each one counts
    generated = sum(a["usage"]["completion_tokens"] for a in answers)
    assert generated_after - generated_before == generated
