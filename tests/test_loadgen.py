"""The load generator: the simulator's workloads against a live server, the simulator's JSON keys
plus ITL and goodput, exact answer lengths, failures counted rather than crashing."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.loadgen import LoadTarget, run_load, summarize_load  # noqa: E402
from course_lib.loadgen.drive import fit_spec  # noqa: E402
from course_lib.loadgen.report import parse_slo  # noqa: E402
from course_lib.loadgen.scrape import parse_prometheus  # noqa: E402
from course_lib.serve.launch import ServerThread, free_port  # noqa: E402
from course_lib.sim.workload import ClosedLoopUsers, LengthDist, RequestSpec, open_loop  # noqa: E402

SHORT = dict(prompt_dist=LengthDist.uniform(4, 30), output_dist=LengthDist.uniform(1, 12))


@pytest.fixture(scope="module")
def server():
    model, tokenizer = load_tiny()
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=16, enable_prefix_caching=True)), tokenizer) as srv:
        yield srv


def test_parse_slo():
    assert parse_slo("ttft_ms=500,tpot_ms=50") == {"ttft_s": 0.5, "tpot_s": 0.05}
    assert parse_slo("latency_s=2") == {"latency_s": 2.0}
    assert parse_slo(None) == {}
    for bad in ("ttft=5", "ttft_ms=abc", "speed_ms=3", "ttft_ms=-1"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_parse_prometheus_sums_label_sets():
    text = '# HELP a x\na 1.0\nb{r="x"} 2\nb{r="y"} 3.5\nvllm:num_requests_running{model_name="m"} 4\n'
    assert parse_prometheus(text) == {"a": 1.0, "b": 5.5, "vllm:num_requests_running": 4.0}


def test_fit_spec_clips_like_simulate():
    spec = RequestSpec("r0", prompt_len=400, output_len=300, arrival_time=0.0, user=0)
    served, clipped = fit_spec(spec, max_model_len=256, max_tokens=512)
    assert (served.prompt_len, served.output_len, clipped) == (255, 1, True)
    served, clipped = fit_spec(RequestSpec("r1", 20, 10, 0.0, 0), 256, 512)
    assert (served.prompt_len, served.output_len, clipped) == (20, 10, False)
    served, _ = fit_spec(RequestSpec("r2", 20, 100, 0.0, 0), 256, 30)
    assert served.output_len == 30


def test_closed_loop_run_has_simulate_keys_itl_goodput_and_exact_lengths(server):
    workload = ClosedLoopUsers(8, 24, seed=1, **SHORT)
    result = run_load(LoadTarget(server.url, max_model_len=256), workload, progress=False)
    summary = summarize_load(result, parse_slo("ttft_ms=60000,tpot_ms=60000"))
    assert summary["requests_completed"] == 24 and summary["requests_failed"] == 0
    # ignore_eos + max_tokens = the workload's length: the server produced exactly the planned answers.
    assert summary["output_tokens"] == sum(s.output_len for s in result["specs"])
    assert summary["prompt_tokens"] == sum(s.prompt_len for s in result["specs"])
    for key in ("requests_completed", "requests_failed", "output_tokens", "throughput_tok_s", "ttft_s", "tpot_s",
                "latency_s", "kv_waste_frac", "peak_running", "preemptions", "prefix_hit_rate"):
        assert key in summary
    assert summary["itl_s"]["p50"] is not None and summary["itl_s"]["p50"] >= 0
    assert summary["goodput_req_s"] == pytest.approx(summary["requests_per_s"])  # generous SLO: all meet it
    assert summary["requests_meeting_slo"] == 24
    assert 0 <= summary["peak_running"] <= 8  # sampled from /metrics (a short run may fall between samples)
    assert summary["preemptions"] == 0
    assert summary["kv_waste_frac"] is None  # a client cannot see it: null, not a made-up 0
    assert all(r.first_token_time <= r.finish_time for r in result["records"])


def test_tight_slo_lowers_goodput(server):
    result = run_load(LoadTarget(server.url, max_model_len=256), ClosedLoopUsers(4, 8, seed=2, **SHORT),
                      progress=False)
    strict = summarize_load(result, {"ttft_s": 1e-9})
    assert strict["requests_meeting_slo"] == 0 and strict["goodput_req_s"] == 0.0
    assert strict["requests_completed"] == 8


def test_open_loop_and_shared_prefix_hits_the_prefix_cache(server):
    specs = open_loop(12, rate=200.0, seed=3, burstiness=0.5, shared_prefix=48, **SHORT)
    result = run_load(LoadTarget(server.url, max_model_len=256), specs, progress=False)
    summary = summarize_load(result)
    assert summary["requests_completed"] == 12
    assert summary["prefix_hit_rate"] > 0  # the 48 shared tokens (3 pages) were served from the cache


def test_a_server_that_is_not_there_counts_failures_not_crashes():
    url = f"http://127.0.0.1:{free_port()}"
    result = run_load(LoadTarget(url, max_model_len=256, scrape_metrics=False), ClosedLoopUsers(2, 4, **SHORT),
                      progress=False)
    summary = summarize_load(result)
    assert summary["requests_failed"] == 4 and summary["requests_completed"] == 0
    assert any("Connect" in e or "connect" in e for e in summary["errors"])


def test_load_command_writes_the_simulate_json_keys(server, tmp_path):
    from course_lib.loadgen.cli import main as load_main
    from course_lib.sim.cli import main as simulate_main

    sim_path, load_path = tmp_path / "sim.json", tmp_path / "load.json"
    assert simulate_main(["--users", "4", "--requests", "8", "--json", str(sim_path), "--no-progress"]) == 0
    assert load_main(["--url", server.url, "--users", "4", "--requests", "8", "--prompt-len", "4:20",
                      "--output-len", "2:8", "--slo", "ttft_ms=5000", "--json", str(load_path),
                      "--no-progress"]) == 0
    sim, load = json.loads(sim_path.read_text()), json.loads(load_path.read_text())
    missing = set(sim) - set(load)
    assert not missing, f"load --json lacks simulate's keys {sorted(missing)}"
    assert {"itl_s", "goodput_req_s", "slo"} <= set(load)
    assert load["requests_completed"] == 8 and load["config"]["model"] == "tiny"
    assert load["config"]["max_model_len"] == 256  # discovered from /v1/models


def test_load_command_refuses_bad_flags(capsys):
    from course_lib.loadgen.cli import main as load_main

    for argv, needle in [(["--users", "0"], "--users must be >= 1"), (["--rate", "-1"], "--rate must be > 0"),
                         (["--users", "2", "--burstiness", "0.5"], "--burstiness applies to open-loop"),
                         (["--users", "2", "--slo", "ttft=3"], "--slo"),
                         (["--users", "2", "--prompt-len", "9:3"], "--prompt-len")]:
        with pytest.raises(SystemExit):
            load_main(["--url", "http://127.0.0.1:9"] + argv)
        assert needle in capsys.readouterr().err


# ------------------------------------------------------------------------------------ prediction
def test_fit_points_recovers_overhead_and_peak():
    from course_lib.loadgen.predict import fit_points
    from course_lib.sim.hardware import ModelShape

    shape = ModelShape.from_config(load_tiny()[0].config)
    overhead, peak = 2e-4, 5e9
    points = [(flops, overhead + flops / peak) for flops in (1e6, 4e6, 3e7, 8e8)]
    fitted = fit_points(points, shape)
    assert fitted.overhead_s == pytest.approx(overhead, rel=1e-6)
    assert fitted.peak_flops == pytest.approx(peak, rel=1e-6)
    with pytest.raises(ValueError, match="two FLOP counts"):
        fit_points([(1e6, 1e-3), (1e6, 2e-3)], shape)


def test_simulate_takes_a_ready_clock():
    from course_lib.sim.clock import SimulatedClock
    from course_lib.sim.hardware import GPUSpec
    from course_lib.sim.simulate import simulate

    clock = SimulatedClock(GPUSpec("slow chip", 1e12, 1e11, 0), "llama-3-8b", overhead_s=0.01)
    result = simulate(EngineConfig(max_num_seqs=4), ClosedLoopUsers(2, 6, seed=0, **SHORT), clock=clock,
                      progress=False)
    assert result.engine.clock is clock
    assert result.summary["sim_time_s"] == pytest.approx(clock.now())
    assert clock.now() >= 0.01 * len(result.steps)  # every step paid the overhead given
    assert result.config["clock"] == "SimulatedClock" and result.config["gpu"] == "slow chip"


def test_prediction_serves_the_load_workload_on_the_fitted_clock():
    from course_lib.loadgen.predict import fit_cpu, predict

    model, _ = load_tiny()
    config = EngineConfig(max_num_seqs=8)
    fitted = fit_cpu(model, config, batch_sizes=(1, 8), steps=3)
    assert fitted.overhead_s >= 0 and fitted.peak_flops > 0 and fitted.max_model_len == 256
    workload = ClosedLoopUsers(4, 12, seed=3, prompt_dist=LengthDist.uniform(200, 400), output_dist=SHORT["output_dist"])
    result = predict(config, workload, fitted)
    summary = result.summary
    assert summary["requests_completed"] == 12 and summary["requests_failed"] == 0
    assert result.engine.max_model_len == 256  # the server's context: long prompts are clipped as it clips them
    assert summary["output_tokens"] == sum(s.output_len for s in result.specs)
    assert max(s.prompt_len for s in result.specs) == 255
    # Every step is priced by the fitted line, nothing else.
    step = result.steps[0]
    assert step.end_time - step.start_time == pytest.approx(fitted.step_time(step))


def test_the_comparison_plot_is_in_ms_with_its_legend_off_the_panels():
    from course_lib.loadgen.compare import measured_vs_predicted
    from course_lib.sim.simulate import simulate

    run = simulate(EngineConfig(max_num_seqs=4), ClosedLoopUsers(3, 6, seed=0, **SHORT), progress=False)
    fig = measured_vs_predicted({"a": run.requests, "b": run.requests}, title="t")
    axes = fig.axes
    assert [ax.get_xlabel().endswith("(ms)") for ax in axes] == [True, True, True]
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    ttft_ms = sorted(r.first_token_time - r.arrival_time for r in run.requests)[-1] * 1e3
    assert axes[0].lines[0].get_xdata().max() == pytest.approx(ttft_ms)  # the values drawn are in ms
