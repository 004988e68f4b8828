"""The step profile the engine and its runner record themselves (`LLMEngine.profile_steps`): off by
default and then silent, the same step when on, and phases that account for the whole step."""
from __future__ import annotations

import ast
import inspect
import statistics
import textwrap
import time

import pytest
import torch

import course_lib
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib import runner as runner_module
from course_lib import step_profile
from course_lib.bench.engine_step import PHASES as TABLE_PHASES
from course_lib.bench.engine_step import profile_engine_step, table_phases
from course_lib.model.config import ModelConfig
from course_lib.step_profile import PARTS, PHASES

PROMPTS = ["reverse: 58213", "sort: 93127", "count: aabca", "reverse: 1234567"]


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = course_lib.load_tiny()
    return model.float().eval(), [tokenizer.encode_prompt(p) for p in PROMPTS]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _engine(model, prompts, max_tokens=24, **config):
    engine = LLMEngine(model, EngineConfig(**config))
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return engine


def _c_forward_builds() -> bool:
    from course_lib.model.cpu_forward import available

    return available(torch.float32)[0]


def test_off_by_default_and_then_no_clock_is_read(tiny, monkeypatch):
    model, prompts = tiny

    def no_clock():
        raise AssertionError("the step read the profile's clock with profiling off")

    monkeypatch.setattr(step_profile, "perf_counter_ns", no_clock)
    monkeypatch.setattr(runner_module, "perf_counter_ns", no_clock)
    engine = _engine(model, prompts, forward="eager")
    assert engine.step_profile is None and engine.runner.step_profile is None
    while engine.has_unfinished_requests:
        engine.step()


def test_turning_it_off_records_nothing_more(tiny):
    model, prompts = tiny
    engine = _engine(model, prompts)
    profile = engine.profile_steps()
    engine.step()
    engine.step()
    assert len(profile.rows) == 2 and engine.runner.step_profile is profile
    assert engine.profile_steps(False) is None
    assert engine.step_profile is None and engine.runner.step_profile is None
    while engine.has_unfinished_requests:
        engine.step()
    assert len(profile.rows) == 2


def test_the_profiled_step_makes_the_same_calls_as_the_step():
    """`_profiled_step` is `step` with marks in between: the same calls on the engine's parts, in
    the same order (the profile's own calls are on a local, not on self)."""
    def calls_on_self(fn) -> list[str]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        names = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                chain, target = [], node.func
                while isinstance(target, ast.Attribute):
                    chain.append(target.attr)
                    target = target.value
                if isinstance(target, ast.Name) and target.id == "self":
                    names.append((node.lineno, ".".join(reversed(chain))))
        return [name for _, name in sorted(names) if name != "_profiled_step"]

    assert calls_on_self(LLMEngine.step) == calls_on_self(LLMEngine._profiled_step) == [
        "clock.now", "scheduler.next_step", "runner.execute", "scheduler.update", "_record"]


@pytest.mark.parametrize("forward", ["eager", "cpu"])
def test_profiling_changes_no_output(tiny, forward):
    if forward == "cpu" and not _c_forward_builds():
        pytest.skip("no C forward here (needs a C compiler and an exported BLAS)")
    model, prompts = tiny
    plain = _engine(model, prompts, forward=forward)
    profiled = _engine(model, prompts, forward=forward)
    profiled.profile_steps()
    while plain.has_unfinished_requests or profiled.has_unfinished_requests:
        assert [(o.request_id, o.new_token_ids) for o in plain.step()] == \
            [(o.request_id, o.new_token_ids) for o in profiled.step()]
    assert len(profiled.step_profile.rows) == len(plain.step_stats)


@pytest.mark.parametrize("forward", ["eager", "cpu"])
def test_the_phases_sum_to_the_measured_step(tiny, forward):
    """Every row's phases fit inside the step timed from outside, and cover all but a few percent
    of it (what they leave out: the call into step() and one `is None` test)."""
    if forward == "cpu" and not _c_forward_builds():
        pytest.skip("no C forward here (needs a C compiler and an exported BLAS)")
    model, prompts = tiny
    engine = _engine(model, prompts * 4, max_tokens=40, forward=forward, attention_backend="auto")
    for _ in range(3):  # warm up: the first steps pay for lazy initialisation
        engine.step()
    profile = engine.profile_steps()
    measured = []
    for _ in range(20):
        t = time.perf_counter_ns()
        engine.step()
        measured.append(time.perf_counter_ns() - t)
    ratios = [total / m for total, m in zip(profile.totals(), measured)]
    assert all(r <= 1.0 for r in ratios), ratios
    assert statistics.median(ratios) >= 0.95, ratios
    for row in profile.rows:
        assert set(row) == set(PHASES + PARTS) and all(v >= 0 for v in row.values()), row
        assert row["forward"] > 0 and row["sample"] > 0 and row["schedule"] > 0 and row["update"] > 0
        if forward == "cpu":
            assert row["c_forward"] == row["forward"] and row["attention"] == 0
        else:
            assert 0 < row["attention"] < row["forward"] and row["c_forward"] == 0


def test_a_runner_that_records_nothing_leaves_its_step_in_prepare():
    config = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, max_position_embeddings=64)
    engine = LLMEngine(config, EngineConfig())  # the scripted runner: no model, no forward
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    profile = engine.profile_steps()
    while engine.has_unfinished_requests:
        engine.step()
    assert profile.rows and all(r["forward"] == r["sample"] == 0 and r["prepare"] > 0 for r in profile.rows)


def test_bench_engine_profile_reads_the_recorded_phases(tiny):
    model, _ = tiny
    p = profile_engine_step(model, running=8, prompt_len=8, steps=10)
    assert set(p["median_us"]) == set(TABLE_PHASES) | {"total"}
    assert 0.9 <= p["recorded_share"] <= 1.0
    row = {"schedule": 1, "prepare": 2, "forward": 30, "sample": 4, "update": 5, "attention": 10, "c_forward": 0}
    table = table_phases(row)
    assert sum(table.values()) == sum(row[k] for k in PHASES)
    assert table["forward_attention"] == 10 and table["forward_rest"] == 20 and table["forward_cpu"] == 0

