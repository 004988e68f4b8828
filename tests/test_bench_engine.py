"""The benchmarks' correctness (never their speed): `to_hf` parity, and that `bench engine`,
the step profile and `bench scheduler` run on tiny configurations and return well-formed results."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import random_model, random_prompts

transformers = pytest.importorskip("transformers")

from course_lib import EngineConfig  # noqa: E402
from course_lib.attention import default_backend  # noqa: E402
from course_lib.bench import engine as bench_engine  # noqa: E402
from course_lib.bench.scheduler import bench_scheduler, format_results  # noqa: E402
from course_lib.model.hf import from_hf  # noqa: E402
from course_lib.model.to_hf import to_hf  # noqa: E402

TOL = 1e-9
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _with_random_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


# --------------------------------------------------------------------------- to_hf
@pytest.mark.parametrize("variant", ["llama-gqa", "llama-mha-head_dim", "qwen2-tied", "llama3-rope"])
def test_to_hf_logits_match_and_round_trip(variant):
    overrides = {
        "llama-gqa": {},
        "llama-mha-head_dim": dict(num_heads=4, num_kv_heads=4, head_dim=16),
        "qwen2-tied": dict(attention_bias=True, tie_word_embeddings=True),
        "llama3-rope": dict(rope_theta=5e5, rope_scaling=dict(LLAMA3), head_dim=16),
    }[variant]
    model = _with_random_biases(random_model(3, **overrides))
    hf = to_hf(model)
    assert type(hf).__name__ == ("Qwen2ForCausalLM" if model.config.attention_bias else "LlamaForCausalLM")
    assert hf.dtype == torch.float64
    prompts = random_prompts(3, model.config.vocab_size, 1, 40, seed=3)
    ours = model.dense_logits(prompts)
    with torch.no_grad():
        for p, o in zip(prompts, ours):
            assert float((hf(torch.tensor([p])).logits[0] - o).abs().max()) <= TOL

    back = from_hf(hf)  # the round trip: same config, same logits
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "rope_theta", "rope_scaling", "attention_bias", "tie_word_embeddings", "rms_norm_eps"):
        assert getattr(back.config, key) == getattr(model.config, key), key
    for a, b in zip(back.dense_logits(prompts), ours):
        assert float((a - b).abs().max()) <= TOL


def test_to_hf_copies_weights():
    model = random_model(4)
    hf = to_hf(model)
    with torch.no_grad():
        model.layers[0].gate_up_proj.add_(1.0)
    gate_up = torch.cat([hf.model.layers[0].mlp.gate_proj.weight, hf.model.layers[0].mlp.up_proj.weight])
    assert not torch.equal(gate_up, model.layers[0].gate_up_proj)


def test_to_hf_greedy_generate_matches():
    model = random_model(5)
    hf = to_hf(model)
    hf.generation_config.eos_token_id = None
    ids = random_prompts(1, model.config.vocab_size, 9, 9, seed=5)[0]
    x = torch.tensor([ids])
    out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=6, pad_token_id=0)
    assert out[0, len(ids):].tolist() == model.generate(ids, 6, stop_token_ids=[])


# --------------------------------------------------------------------------- bench engine
def test_bench_engine_tiny_run_is_well_formed(tmp_path):
    model = bench_engine.random_tiny_model(0, num_layers=2, hidden_size=64, intermediate_size=128)
    hf = to_hf(model)
    workloads = bench_engine.make_workloads(model, None, num_prompts=6, max_tokens=5, seed=1)
    assert [w.name for w in workloads] == ["mixed", "uniform"]
    mixed, uniform = workloads
    assert len({len(p) for p in uniform.prompts}) == 1 and set(uniform.max_tokens) == {5}
    assert all(1 <= m <= 5 for m in mixed.max_tokens)
    # A prompt token equal to the pad id must not be masked by the static engine.
    mixed.prompts[0][3] = model.config.pad_token_id
    config = EngineConfig(attention_backend="torch", max_num_seqs=4, max_num_batched_tokens=64)
    for w in workloads:
        r = bench_engine.bench_workload(model, hf, w, repeats=1, config=config, warmup=False)
        assert set(r["engines"]) == set(bench_engine.ENGINES)
        for e in r["engines"].values():
            assert e["output_tokens"] == sum(w.max_tokens)  # EOS ignored: every budget exactly
            assert e["median_s"] > 0 and e["tok_s"] > 0
        for name in ("hf_continuous", "hf_static"):
            assert r["speedup"][name] > 0 and r["speedup_cpu"][name] > 0
            # Same weights, float32, greedy: the same answers (these weights leave no near-ties).
            assert r["agreement"][name] == {"requests": 1.0, "tokens": 1.0}
    json.dumps(r)


def test_run_benchmark_and_table(tmp_path):
    result = bench_engine.run_benchmark("random", num_prompts=3, max_tokens=3, repeats=1, threads=1,
                                        engines=("course_lib", "hf_static"), workloads=("uniform",))
    assert result["model"] == "random" and len(result["workloads"]) == 1
    assert result["attention_backend"] == default_backend("cpu", torch.float32)  # what "auto" picks here
    table = bench_engine.format_table(result)
    assert "hf_static" in table and "uniform" in table
    assert f"course_lib attention: {result['attention_backend']}, forward: {result['forward']}" in table
    assert result["forward"] == ("cpu" if result["attention_backend"] == "cpu" else "eager")
    json.dumps(result)
    forced = bench_engine.run_benchmark("random", num_prompts=2, max_tokens=2, repeats=1, threads=1,
                                        engines=("course_lib",), workloads=("uniform",), attention="torch")
    assert forced["attention_backend"] == "torch" and forced["forward"] == "eager"


def test_useful_tokens_and_agreement():
    assert bench_engine._useful([5, 2, 7], 3, {2}) == [5, 2]
    assert bench_engine._useful([5, 6, 7], 2, set()) == [5, 6]
    a = bench_engine.agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert a["requests"] == 0.5 and a["tokens"] == pytest.approx(4 / 5)


def test_profile_engine_step_phases():
    model = bench_engine.random_tiny_model(0, num_layers=1, hidden_size=32, intermediate_size=64)
    p = bench_engine.profile_engine_step(model, running=8, prompt_len=4, steps=3, cprofile_top=3)
    assert set(p["median_us"]) == set(bench_engine.PHASES) | {"total"}
    assert all(v >= 0 for k, v in p["median_us"].items() if k != "update")
    assert p["forward"] == "cpu" and p["median_us"]["forward_cpu"] > 0  # auto on a CPU with a compiler
    assert p["median_us"]["forward_rest"] == p["median_us"]["forward_attention"] == 0
    eager = bench_engine.profile_engine_step(model, running=8, prompt_len=4, steps=3,
                                             config=EngineConfig(forward="eager"))
    assert eager["median_us"]["forward_rest"] > 0 and eager["median_us"]["forward_attention"] > 0
    assert eager["median_us"]["forward_cpu"] == 0
    assert "cprofile" in p and "running requests" in bench_engine.format_profile(p)


# --------------------------------------------------------------------------- bench engine --speculative
def test_bench_speculative_tiny_run_is_well_formed():
    from course_lib.bench import speculative

    model = bench_engine.random_tiny_model(0, num_layers=2, hidden_size=32, intermediate_size=64)
    # Prompts that repeat themselves, so the n-gram drafter has matches to draft from.
    prompts = [[5, 6, 7, 8] * 3, [9, 10, 9, 10, 9, 10], [11, 12, 13, 11, 12, 13, 11]]
    levels = speculative.bench_speculative(model, prompts, max_tokens=6, concurrency=(1, 2), repeats=2,
                                           config=EngineConfig(attention_backend="torch"), warmup=False)
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        runs = level["runs"]
        assert list(runs) == ["none", "ngram", "draft"]
        assert runs["none"]["num_draft_tokens"] == 0 and runs["none"]["acceptance_rate"] is None
        for name, r in runs.items():
            assert len(r["tok_s"]) == 2 and r["tok_s_spread"][0] <= r["median_tok_s"] <= r["tok_s_spread"][1]
            assert r["ratio_spread"][0] <= r["ratio"] <= r["ratio_spread"][1]
            assert r["output_tokens"] == runs["none"]["output_tokens"] > 0
            assert r["same_answers"] == 1.0  # greedy: speculation never changes an answer
        for name in ("ngram", "draft"):
            r = runs[name]
            assert r["num_draft_tokens"] > 0 and 0.0 <= r["acceptance_rate"] <= 1.0
            assert r["tokens_per_drafted_step"] == 1 + r["num_accepted_tokens"] / r["num_drafts"]
        assert runs["none"]["ratio"] == 1.0
    json.dumps(levels)
    with pytest.raises(ValueError, match="drafters"):
        speculative.bench_speculative(model, prompts, drafters=("eagle",))


def test_bench_engine_speculative_command(tmp_path, capsys):
    path = tmp_path / "spec.json"
    assert bench_engine.main(["--speculative", "--model", "random", "--num-prompts", "3", "--max-tokens", "3",
                              "--repeats", "1", "--concurrency", "1,2", "--drafters", "ngram",
                              "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "vs none" in out and "ngram" in out and "tok/drafted step" in out
    result = json.loads(path.read_text())
    assert [w["workload"] for w in result["workloads"]] == ["mixed"]  # random prompts: one workload
    assert [level["concurrency"] for level in result["workloads"][0]["levels"]] == [1, 2]
    assert result["num_speculative_tokens"] == EngineConfig().num_speculative_tokens


# --------------------------------------------------------------------------- bench scheduler
@pytest.mark.parametrize("mode", ["decode", "churn"])
def test_bench_scheduler_well_formed(mode):
    r = bench_scheduler(running=16, steps=20, mode=mode, prompt_len=8, mean_output_len=4, warmup_steps=2)
    assert r["mode"] == mode and r["steps"] == 20
    s = r["step_us"]
    assert 0 < s["median"] <= s["p99"] <= s["max"]
    if mode == "decode":
        assert r["mean_running"] == 16 and r["finished_per_step"] == 0
    else:
        assert r["finished_per_step"] > 0
    assert "decode" in format_results([r]) or "churn" in format_results([r])


def test_bench_cli_lists_benchmarks(capsys):
    from course_lib.bench.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("attention", "engine", "scheduler"):
        assert name in out
    assert main(["nope"]) == 2
