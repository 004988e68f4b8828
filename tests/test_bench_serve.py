"""`bench serve` runs end to end on a small configuration, with the engine in its own process and in a
thread, and reports the same tokens on both sides (its speed is never asserted: docs/benchmarks.md)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("aiohttp")

from course_lib.bench import serve as bench_serve  # noqa: E402


@pytest.mark.parametrize("mode", [[], ["--engine-thread"]], ids=["engine-process", "engine-thread"])
def test_bench_serve_runs_and_both_sides_agree(mode, capsys):
    code = bench_serve.main(["--streams", "4", "--requests", "8", "--max-tokens", "6", "--repeats", "1", *mode])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "same tokens on both sides: yes" in out
    assert ("a thread" if mode else "its own process") in out
    ratio = float(re.search(r"ratio HTTP / in process: ([0-9.]+)x, best vs best", out).group(1))
    assert re.search(r"run by run .*: median [0-9.]+x \([0-9.]+\)", out), out
    assert ratio > 0
    assert re.search(r"added latency per token .*p50 -?[0-9.]+ ms, p99 -?[0-9.]+ ms", out), out


def test_bench_serve_refuses_bad_sizes(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_serve.main(["--max-tokens", "1"])
    assert exit_.value.code == 2
    assert "--max-tokens must be >= 2" in capsys.readouterr().err
