"""A server started with ServerProcess (what notebook 08 and the benchmark use) never outlives the
process that started it: not when that process exits without stopping it (atexit), not when it is
killed outright (the server watches its parent); and neither does the server's engine process.
Each case starts a real `python -m course_lib serve` from a short-lived Python parent on a free
loopback port."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from serve_support import engine_process_of

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

PARENT = """
import sys, time
from course_lib.serve.launch import ServerProcess
server = ServerProcess(["--max-num-seqs", "4", "--no-dashboard"])
print(server.proc.pid, server.url, flush=True)
if sys.argv[1] == "hang":
    time.sleep(600)
"""  # "exit": leave without stop(); "hang": wait to be killed


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts: it runs nothing and holds no port)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid) and not answers(url):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)  # do not leave it behind for the next test
    raise AssertionError(f"server {pid} still running {timeout:.0f} s after its parent went")


def wait_all_gone(pids, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if not gone(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes {left} outlived the server's parent"


def start_parent(mode: str):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = parent.stdout.readline()
    assert line, f"the parent printed nothing (exit code {parent.wait(60)})"
    pid, url = line.split()
    return parent, int(pid), url


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_parent_that_exits_without_stopping_stops_its_server():
    parent, pid, url = start_parent("exit")
    engine = engine_process_of(pid)
    assert parent.wait(60) == 0
    wait_gone(pid, url)
    wait_all_gone([engine])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_parent_takes_its_server_with_it():
    parent, pid, url = start_parent("hang")
    try:
        assert answers(url), "the server should be up while its parent lives"
        engine = engine_process_of(pid)
    finally:
        parent.kill()  # SIGKILL: no atexit, no cleanup of any kind in the parent
        parent.wait(30)
    wait_gone(pid, url)
    wait_all_gone([engine])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_killed_outright_takes_its_engine_process_with_it():
    parent, pid, url = start_parent("hang")
    try:
        engine = engine_process_of(pid)
        os.kill(pid, signal.SIGKILL)  # the HTTP process dies without a word: its pipes close
        wait_all_gone([engine])
    finally:
        parent.kill()
        parent.wait(30)
