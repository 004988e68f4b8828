"""The names each string knob of the engine takes are listed once, in `engine_config.OPTIONS`:
EngineConfig accepts exactly those (and its error lists them), the engine builds what each names,
and every command line that offers a knob lists all of them in its --help."""
from __future__ import annotations

import re

import pytest

from course_lib import attention
from course_lib.engine import LLMEngine
from course_lib.engine_config import ADMISSION_POLICIES, OPTIONS, SCHEDULERS, EngineConfig
from course_lib.model.config import ModelConfig
from course_lib.scheduler.admission import make_admission
from course_lib.scheduler.base import PREEMPTION_MODES

ENTRIES = [(knob, name) for knob, names in OPTIONS.items() for name in names]
# Each command line's flag for a knob (simulate names the KV layout --kv).
SIMULATE_FLAGS = {"scheduler": "--scheduler", "kv_layout": "--kv", "admission": "--admission",
                  "preemption": "--preemption"}
SERVE_FLAGS = {"scheduler": "--scheduler", "kv_layout": "--kv-layout", "admission": "--admission",
               "preemption": "--preemption", "attention_backend": "--attention-backend", "forward": "--forward",
               "speculative": "--speculative"}


def _simulate_help() -> str:
    from course_lib.sim.cli import build_parser

    return build_parser().format_help()


def _serve_help() -> str:
    from course_lib.serve.cli import build_parser

    return build_parser().format_help()


def _bench_engine_help(capsys) -> str:
    from course_lib.bench.engine import main

    with pytest.raises(SystemExit):
        main(["--help"])
    return capsys.readouterr().out


def _listed(help_text: str, flag: str) -> list[str]:
    """The choices --help shows for `flag` ("--kv {paged,contiguous}" -> ["paged", "contiguous"])."""
    found = re.search(rf"^\s+{re.escape(flag)} \{{([^}}]*)\}}", help_text, re.M)
    assert found, f"{flag} with its choices is not in the --help text:\n{help_text}"
    return found.group(1).split(",")


@pytest.mark.parametrize("knob,name", ENTRIES, ids=[f"{k}={n}" for k, n in ENTRIES])
def test_every_registry_entry_is_accepted(knob, name):
    assert getattr(EngineConfig(**{knob: name}), knob) == name


@pytest.mark.parametrize("knob", list(OPTIONS))
def test_a_name_outside_the_registry_is_refused_with_the_whole_list(knob):
    with pytest.raises(ValueError, match=f"^{knob} must be ") as err:
        EngineConfig(**{knob: "no-such-option"})
    message = str(err.value)
    assert all(name in message for name in OPTIONS[knob]) and "'no-such-option'" in message


def test_the_engine_builds_what_each_name_stands_for():
    model = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, max_position_embeddings=64)
    for name, cls in SCHEDULERS.items():
        assert type(LLMEngine(model, EngineConfig(scheduler=name)).scheduler) is cls and cls.name == name
    for name, cls in ADMISSION_POLICIES.items():
        assert type(LLMEngine(model, EngineConfig(admission=name)).admission) is cls and cls.name == name
        assert type(make_admission(name)) is cls
    for name in OPTIONS["preemption"]:
        assert LLMEngine(model, EngineConfig(preemption=name)).scheduler.preemption == name
    paged = LLMEngine(model, EngineConfig(kv_layout="paged", page_size=8))
    contiguous = LLMEngine(model, EngineConfig(kv_layout="contiguous", page_size=8))
    assert set(OPTIONS["kv_layout"]) == {"paged", "contiguous"}
    assert paged.pool.page_size == 8 and contiguous.pool.page_size == 64  # one max_model_len page per request


def test_the_lists_that_live_beside_their_code_are_the_registrys():
    # The scheduler's own check takes the same tuple; the attention package (which loads torch,
    # so engine_config does not import it) offers the same backends, plus "auto".
    assert OPTIONS["preemption"] is PREEMPTION_MODES
    assert sorted(OPTIONS["attention_backend"]) == sorted(("auto", *attention.BACKENDS))
    with pytest.raises(ValueError, match="preemption must be one of"):
        SCHEDULERS["continuous"](None, None, 1, 1, preemption="no-such-option")


def test_every_command_line_lists_every_entry(capsys):
    simulate, serve = _simulate_help(), _serve_help()
    for knob, flag in SIMULATE_FLAGS.items():
        assert _listed(simulate, flag) == list(OPTIONS[knob]), f"simulate {flag}"
    for knob, flag in SERVE_FLAGS.items():
        assert sorted(_listed(serve, flag)) == sorted(OPTIONS[knob]), f"serve {flag}"
    bench = _bench_engine_help(capsys)
    # bench engine keeps its model on the CPU: every backend but the GPU kernel
    assert _listed(bench, "--attention") == [b for b in OPTIONS["attention_backend"] if b != "triton"]
    assert _listed(bench, "--forward") == list(OPTIONS["forward"])


def test_a_new_registry_entry_reaches_the_config_and_the_command_lines(monkeypatch, capsys):
    """What "derived" means: add a name to the registry and EngineConfig accepts it, and simulate,
    serve and bench engine offer it, with no other list to edit."""
    for knob in OPTIONS:
        monkeypatch.setitem(OPTIONS, knob, (*OPTIONS[knob], f"new-{knob}"))
        assert getattr(EngineConfig(**{knob: f"new-{knob}"}), knob) == f"new-{knob}"
    simulate = _simulate_help()
    for knob, flag in SIMULATE_FLAGS.items():
        assert f"new-{knob}" in _listed(simulate, flag), f"simulate {flag} does not take its choices from OPTIONS"
    serve = _serve_help()
    for knob, flag in SERVE_FLAGS.items():
        assert f"new-{knob}" in _listed(serve, flag), f"serve {flag} does not take its choices from OPTIONS"
    bench = _bench_engine_help(capsys)
    assert "new-attention_backend" in _listed(bench, "--attention") and "new-forward" in _listed(bench, "--forward")
