"""`python -m course_lib simulate` and `demo`: every DESIGN.md flag, every JSON key, clear errors."""
import json
import subprocess
import sys

import pytest

from course_lib.sim import cli, demo

CONTRACT_KEYS = {
    "requests_completed": int, "requests_failed": int, "output_tokens": int, "throughput_tok_s": float,
    "kv_waste_frac": float, "peak_running": int, "preemptions": int, "prefix_hit_rate": float,
}
PERCENTILE_KEYS = ("ttft_s", "tpot_s", "latency_s")
FAST = ["--no-progress", "--kv-tokens", "4096", "--max-tokens", "64"]


def run_cli(tmp_path, *flags):
    path = tmp_path / "out.json"
    assert cli.main([*flags, *FAST, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def check_contract(data):
    for key, kind in CONTRACT_KEYS.items():
        assert key in data, f"JSON lacks {key}"
        assert isinstance(data[key], kind) and not isinstance(data[key], bool), f"{key} is {type(data[key])}"
    for key in PERCENTILE_KEYS:
        assert isinstance(data[key], dict) and {"p50", "p99"} <= set(data[key]), key
        assert all(isinstance(data[key][q], float) for q in ("p50", "p99")), key


@pytest.fixture
def tiny_or_random(monkeypatch, small_model):
    """The model runner's model: the shipped tiny model if it is built, else a small random one."""
    import torch

    try:
        cli._load_model()
    except FileNotFoundError:
        monkeypatch.setattr(cli, "_load_model", lambda: (small_model, None))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_every_design_flag_is_accepted_and_every_key_written(tmp_path, capsys):
    data = run_cli(tmp_path, "--users", "8", "--requests", "24", "--scheduler", "continuous", "--kv", "paged",
                   "--page-size", "8", "--admission", "reserve", "--prefix-caching", "--shared-prefix", "32",
                   "--runner", "scripted", "--clock", "simulated", "--seed", "1")
    check_contract(data)
    assert data["requests_completed"] == 24 and data["requests_failed"] == 0
    assert data["prefix_hit_rate"] > 0
    assert data["config"]["engine"]["page_size"] == 8 and data["config"]["kv_pool_tokens"] == 4096
    out = capsys.readouterr().out
    assert "throughput (tok/s)" in out and "continuous + paged" in out


def test_rate_and_users_both_work(tmp_path):
    open_loop = run_cli(tmp_path, "--rate", "40", "--requests", "20")
    closed = run_cli(tmp_path, "--users", "5", "--requests", "20", "--think-time", "0.1")
    assert open_loop["config"]["workload"]["kind"] == "open_loop"
    assert closed["config"]["workload"] == {"kind": "closed_loop", "users": 5, "requests": 20,
                                            "think_time_s": 0.1, "shared_prefix": 0}
    assert open_loop["requests_completed"] == closed["requests_completed"] == 20
    assert closed["peak_running"] <= 5


@pytest.mark.parametrize("scheduler,kv", [("static", "contiguous"), ("static", "paged"), ("continuous", "contiguous")])
def test_other_layouts(tmp_path, scheduler, kv):
    data = run_cli(tmp_path, "--users", "6", "--requests", "12", "--scheduler", scheduler, "--kv", kv,
                   "--admission", "none", "--max-model-len", "1024")
    check_contract(data)
    assert data["requests_completed"] == 12


def test_same_seed_same_json(tmp_path):
    a = run_cli(tmp_path, "--users", "6", "--requests", "18", "--seed", "7")
    b = run_cli(tmp_path, "--users", "6", "--requests", "18", "--seed", "7")
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b


def test_trace_round_trip(tmp_path):
    trace = tmp_path / "trace.jsonl"
    first = run_cli(tmp_path, "--rate", "30", "--requests", "10", "--save-trace", str(trace))
    again = run_cli(tmp_path, "--trace", str(trace))
    assert again["requests_completed"] == 10
    assert again["output_tokens"] == first["output_tokens"]


def test_model_runner_with_wall_clock(tmp_path, tiny_or_random):
    data = run_cli(tmp_path, "--runner", "model", "--clock", "wall", "--users", "2", "--requests", "3",
                   "--max-num-batched-tokens", "128")
    check_contract(data)
    assert data["requests_completed"] == 3 and data["output_tokens"] > 0
    assert data["config"]["runner"] == "model" and data["config"]["clock"] == "wall"


def test_plots(tmp_path):
    run_cli(tmp_path, "--users", "4", "--requests", "8", "--plots", str(tmp_path / "plots"))
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"timeline.png", "kv_utilisation.png", "queue_lengths.png", "latency_cdfs.png", "page_pool_map.png"} <= names


@pytest.mark.parametrize("flags,message", [
    (["--users", "4", "--rate", "2"], "not allowed with argument"),
    (["--users", "0"], "--users must be >= 1"),
    (["--rate", "-1"], "--rate must be > 0"),
    (["--kv-tokens", "512"], "smaller than one request can ever need"),
    (["--kv", "contiguous", "--kv-tokens", "1024"], "reserves --max-model-len 2048"),
    (["--kv", "contiguous", "--prefix-caching"], "--prefix-caching needs --kv paged"),
    (["--kv", "contiguous", "--kv-tokens", "4000"], "can never admit"),
    (["--page-size", "32", "--kv-tokens", "16"], "smaller than one page"),
    (["--rate", "3", "--think-time", "1"], "--think-time applies to closed-loop"),
    (["--users", "3", "--burstiness", "0.5"], "--burstiness applies to open-loop"),
    (["--clock", "wall", "--gpu", "A100"], "describe the simulated clock"),
    (["--scheduler", "fifo"], "invalid choice"),
    (["--shared-prefix", "5000"], "leaves no room"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace"),
    (["--speculative", "-1"], "--speculative must be >= 0"),
    (["--acceptance-rate", "0.5"], "apply to --speculative K > 0 only"),
    (["--speculative", "2", "--acceptance-rate", "1.5"], "--acceptance-rate must be a probability"),
    (["--speculative", "2", "--drafter", "draft"], "needs --runner model"),
    (["--speculative", "2", "--scheduler", "static"], "--speculative needs --scheduler continuous"),
    (["--speculative", "2", "--runner", "model", "--acceptance-rate", "0.5"], "the model decides"),
    (["--speculative", "2", "--draft-layers", "2"], "--draft-layers applies to --drafter draft only"),
])
def test_bad_flags_fail_clearly(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*flags, "--no-progress"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_speculative_runs_beside_the_run_without(tmp_path, capsys):
    data = run_cli(tmp_path, "--users", "2", "--requests", "6", "--speculative", "3", "--acceptance-rate", "0.8")
    check_contract(data)
    engine = data["config"]["engine"]
    assert (engine["speculative"], engine["num_speculative_tokens"], engine["spec_acceptance_rate"]) == ("ngram", 3, 0.8)
    plain = data["without_speculation"]
    assert plain["requests_completed"] == data["requests_completed"] == 6
    assert plain["output_tokens"] == data["output_tokens"]  # the same workload, the same answers' lengths
    assert plain["spec_draft_tokens"] == 0 < data["spec_draft_tokens"]
    # 0.8 per draft, 3 drafts: (0.8 + 0.64 + 0.512) / 3 = 65% kept (fewer drafts near a request's end).
    assert data["spec_acceptance_rate"] == pytest.approx(0.65, abs=0.06)
    assert data["tokens_per_drafted_step"] == 1 + data["spec_accepted_tokens"] / data["spec_num_drafts"]
    assert 2.0 < data["tokens_per_drafted_step"] <= 4.0
    assert data["tpot_s"]["p50"] < plain["tpot_s"]["p50"]  # 2 users: memory-bound, drafts nearly free
    out = capsys.readouterr().out
    assert "continuous + paged + ngram k=3" in out and "draft acceptance" in out and "tokens / drafted step" in out
    assert "with / without speculation: TPOT p50 x" in out
    assert "without_speculation" not in run_cli(tmp_path, "--users", "2", "--requests", "4")


def test_kv_tokens_error_names_the_limit(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--kv-tokens", "1000", "--no-progress"])
    err = capsys.readouterr().err
    assert "--kv-tokens >= 2048" in err and "--max-tokens 1024" in err


def test_subcommand_routing_and_help():
    out = subprocess.run([sys.executable, "-m", "course_lib", "simulate", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    for flag in ("--users", "--rate", "--requests", "--scheduler", "--kv", "--page-size", "--kv-tokens",
                 "--admission", "--prefix-caching", "--shared-prefix", "--runner", "--clock", "--seed", "--json",
                 "--speculative", "--acceptance-rate", "--drafter", "--draft-layers"):
        assert flag in out.stdout, flag


def test_demo_writes_its_table_and_plots(tmp_path, capsys, tiny_or_random):
    out_dir = tmp_path / "demo"
    assert demo.main(["--out", str(out_dir), "--users", "6", "--requests", "12", "--sweep-users", "3,6",
                      "--kv-tokens", "4096", "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    for column in ("st/ctg/none", "st/pg/wm", "cb/ctg/none", "cb/pg/wm"):
        assert column in text
    assert "Break it" in text and "Load sweep" in text and "Real tokens" in text
    for name in ("bus_vs_turnstile.png", "page_pool_map.png", "latency_cdfs.png", "kv_utilisation.png",
                 "load_sweep.png"):
        assert (out_dir / name).read_bytes().startswith(b"\x89PNG"), name
    assert str(out_dir.resolve()) in text


def test_a_draft_model_drafts_with_the_layers_asked_and_its_passes_cost_time(tmp_path, tiny_or_random):
    """--draft-layers reaches the engine, and the simulated clock prices the draft model's passes: the same
    run with more of the model's layers drafting is charged more busy time per drafted step."""
    from course_lib.sim.cli import _load_model

    layers = _load_model()[0].config.num_layers
    runs = {}
    for draft_layers in (1, layers - 1):
        data = run_cli(tmp_path, "--runner", "model", "--users", "2", "--requests", "4", "--speculative", "2",
                       "--drafter", "draft", "--draft-layers", str(draft_layers), "--model-shape", "llama-3-8b")
        assert data["config"]["engine"]["draft_layers"] == draft_layers and data["spec_draft_tokens"] > 0
        runs[draft_layers] = data
    few, many = runs[1], runs[layers - 1]
    for data in (few, many):
        assert 0 < data["spec_draft_model_time_s"] < data["sim_time_s"]
    # the same engine steps, but each of a deeper draft model's passes reads more of the weights
    per_draft = {n: d["spec_draft_model_time_s"] / d["spec_draft_tokens"] for n, d in runs.items()}
    assert per_draft[layers - 1] == pytest.approx(per_draft[1] * (layers - 1), rel=0.3), per_draft
    assert runs[1]["without_speculation"]["spec_draft_model_time_s"] == 0.0
