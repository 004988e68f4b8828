"""Start a server and stop it: for the command line, the tests and the notebook.

- `serve_forever(state, ...)`: what `python -m course_lib serve` runs (cli.py builds the state).
- `ServerThread`: uvicorn in a background thread of this process (tests: the engine is at hand).
- `ServerProcess`: `python -m course_lib serve` as a subprocess (the notebook, the benchmark: the
  server's Python threads do not compete with the caller's for one interpreter lock).

Both pick a free loopback port unless told otherwise, wait (bounded) until `/health` answers,
and stop what they started.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from .app import build_server_state, make_app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def local_host(host: str) -> str:
    """Where this machine reaches a server bound to `host` (a wildcard: loopback)."""
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


def room_host(host: str) -> str:
    """The address others on the network use for a server bound to `host`: for a wildcard, this
    machine's outward-facing address (the one its default route would use; a UDP socket's
    connect sends nothing), else `host` itself. Loopback stays loopback: nobody else can reach it."""
    if host not in WILDCARD_HOSTS:
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere, no packet leaves
            return s.getsockname()[0]
        except OSError:
            return socket.gethostname()


def _uvicorn_server(app, host: str, port: int, log_level: str = "warning"):
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=3, backlog=4096)
    return uvicorn.Server(config)


# With the engine in a thread of this process (`serve --engine-thread`), it and the HTTP thread share
# one interpreter lock. When a step's C code returns, the engine thread waits for the lock until the
# HTTP thread yields it, by default every 5 ms: as long as a whole step of the tiny model. A
# shorter interval hands it back sooner.
SWITCH_INTERVAL_S = float(os.environ.get("COURSE_SERVE_SWITCH_INTERVAL", "0.0005"))


def serve_forever(state, host: str = "127.0.0.1", port: int = 8000, dashboard: bool = True,
                  log_level: str = "warning", open_browser: bool = False) -> None:
    """Serve `state` (its engine loop in a thread, or an EngineClient) until stopped; then stop the engine."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = _uvicorn_server(make_app(state, dashboard=dashboard), host, port, log_level)
    if open_browser:
        import webbrowser

        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        threading.Timer(1.5, webbrowser.open, [f"http://{shown}:{port}/dashboard"]).start()
    try:
        server.run()
    finally:
        state.loop.stop()


def wait_healthy(url: str, timeout: float, proc=None) -> None:
    """Poll `url`/health until it answers 200; give up after `timeout` seconds (or if `proc` died)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before answering /health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as err:
            last = err
        time.sleep(0.05)
    raise TimeoutError(f"no answer from {url}/health within {timeout:.0f} s (last error: {last})")


class ServerThread:
    """uvicorn serving `engine` in a background thread. Use as a context manager, or call stop()."""

    def __init__(self, engine, tokenizer, model_name: str = "tiny", host: str = "127.0.0.1", port: int | None = None,
                 max_waiting: int | None = None, dashboard: bool = True, timeout: float = 30.0):
        self.state = build_server_state(engine, tokenizer, model_name, max_waiting=max_waiting)
        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{self.host}:{self.port}"
        self.server = _uvicorn_server(make_app(self.state, dashboard=dashboard), self.host, self.port)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        try:
            wait_healthy(self.url, timeout)
        except Exception:
            self.stop()
            raise

    @property
    def loop(self):
        return self.state.loop

    def stop(self, timeout: float = 10.0) -> None:
        self.state.loop.stop()
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def watch_parent(parent_pid: int, interval_s: float = 0.5, grace_s: float = 10.0) -> threading.Thread:
    """Stop this process (SIGTERM: uvicorn shuts down cleanly) once `parent_pid` is no longer its
    parent: the parent died, however it died (a notebook kernel killed with SIGKILL runs no atexit),
    and the orphan was handed to init. If the clean stop hangs, exit anyway after `grace_s`.

    Polling the parent id, not a death signal from the kernel (prctl PR_SET_PDEATHSIG): that one
    fires when the *thread* that started the server ends, and arming it needs code between fork
    and exec, which is unsafe in a process with threads (a Jupyter kernel has several)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


class ServerProcess:
    """`python -m course_lib serve ARGS` on a free loopback port; its output goes to a log file."""

    def __init__(self, args: list[str] = (), host: str = "127.0.0.1", port: int | None = None,
                 timeout: float = 60.0, threads: int = 1, control_token: str | None = None):
        from .cli import CONTROL_TOKEN_ENV
        from .dashboard import control_token_for

        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{local_host(host)}:{self.port}"  # how this process talks to it
        self.room_url = f"http://{room_host(host)}:{self.port}"  # how others on the network do
        # Beyond loopback the dashboard's controls need a token: made here (or given) and handed to the
        # server through its environment, so that this side can open the dashboard with working buttons
        # (`dashboard_url`) while the room's page (`room_url`) stays view-only.
        self.control_token = control_token_for(host, control_token)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="course_lib_serve_", suffix=".log", delete=False)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.pop(CONTROL_TOKEN_ENV, None)
        if self.control_token is not None:
            env[CONTROL_TOKEN_ENV] = self.control_token
        cmd = [sys.executable, "-m", "course_lib", "serve", "--host", host, "--port", str(self.port),
               "--threads", str(threads), "--parent-pid", str(os.getpid()), *args]
        # A kernel that exits stops its server (atexit); one that is killed, the server notices
        # (--parent-pid): either way no server outlives the notebook that started it.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.stop)
        try:
            wait_healthy(self.url, timeout, self.proc)
        except Exception as err:
            self.stop()
            raise RuntimeError(f"{err}\nserver log:\n{self.log_tail()}") from None

    @property
    def dashboard_url(self) -> str:
        """The dashboard for this machine, with the control token when one is needed (its buttons work);
        the page drops the token from the address bar once read."""
        url = f"{self.url}/dashboard"
        return url if self.control_token is None else f"{url}?token={urllib.parse.quote(self.control_token, safe='')}"

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-chars:]

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.log.closed:
            return  # stopped already
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
