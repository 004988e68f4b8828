"""Who may press the dashboard's buttons, and what a paused engine tells everyone else.

On loopback (how students run it) the controls need nothing. A server others can reach
(`--host 0.0.0.0`) prints a control token at start; a control request without it gets 403 with an
OpenAI-style JSON error, while watching stays open. Paused, `/health` stays 200 and says
`"paused": true`, `/metrics` has `course_lib_engine_paused 1`, and a request sent meanwhile is
accepted and waits in the queue until the engine resumes."""
from __future__ import annotations

import re
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.serve.dashboard import control_token_for, is_loopback  # noqa: E402
from course_lib.serve.launch import ServerProcess, ServerThread  # noqa: E402
from serve_support import wait_until  # noqa: E402

BODY = {"model": "tiny", "prompt": "countdown: 9", "max_tokens": 6, "ignore_eos": True}


def paused_gauge(client) -> float:
    families = text_string_to_metric_families(client.get("/metrics").text)
    (sample,) = [s for f in families if f.name == "course_lib_engine_paused" for s in f.samples]
    assert sample.labels == {"model_name": "tiny"}
    return sample.value


def answer_in_background(url: str, headers=None) -> tuple[threading.Thread, dict]:
    """POST BODY from a thread; the result dict gets the status and JSON once it comes."""
    result = {}

    def run():
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=60, headers=headers)
        result.update(status=r.status_code, json=r.json())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.20", False), ("lecture-hall.local", False), ("", False)])
def test_only_a_loopback_host_goes_without_a_token(host, loopback):
    assert is_loopback(host) is loopback
    token = control_token_for(host)
    assert (token is None) is loopback
    if token is not None:
        assert len(token) >= 20 and token != control_token_for(host), "a token must be random each start"
    assert control_token_for(host, "chosen") == "chosen"  # --control-token: required even on loopback
    with pytest.raises(ValueError, match="must not be empty"):
        control_token_for(host, " ")


def test_on_loopback_controls_need_no_token_and_a_pause_is_visible_to_health_and_metrics():
    model, tokenizer = load_tiny()
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=4)), tokenizer) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["paused"] is False and "detail" not in health.json()
        assert paused_gauge(client) == 0
        assert client.get("/dashboard/state").json()["controls_locked"] is False

        assert client.post("/dashboard/control", json={"action": "pause"}).json()["paused"] is True
        health = client.get("/health")
        assert health.status_code == 200, "a paused engine is alive: a probe must not restart it"
        assert health.json()["paused"] is True and "queue" in health.json()["detail"]
        assert paused_gauge(client) == 1

        # Sent while paused: accepted, waits in the queue (it is neither refused nor lost) ...
        steps = srv.loop.num_steps
        thread, result = answer_in_background(srv.url)
        wait_until(lambda: srv.loop.stats["num_waiting"] == 1, what="the request to queue")
        thread.join(0.5)
        assert thread.is_alive() and not result and srv.loop.num_steps == steps
        # ... and answered in full once the engine resumes.
        client.post("/dashboard/control", json={"action": "resume"})
        thread.join(30)
        assert result["status"] == 200 and result["json"]["usage"]["completion_tokens"] == BODY["max_tokens"]
        assert client.get("/health").json()["paused"] is False and paused_gauge(client) == 0


@pytest.mark.slow
def test_a_server_the_room_can_reach_prints_a_token_and_refuses_controls_without_it():
    with ServerProcess(["--max-num-seqs", "4"], host="0.0.0.0") as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        printed = re.search(r"control token: (\S+)", srv.log_tail())
        assert printed, f"no control token printed at start:\n{srv.log_tail()}"
        token = printed.group(1)
        assert f"/dashboard?token={token}" in srv.log_tail()
        # The notebook's own view has working buttons: the launcher made the token and knows it; the
        # server got it through its environment, not its command line (which every local user can read).
        assert srv.control_token == token and srv.dashboard_url.endswith(f"/dashboard?token={token}")
        with open(f"/proc/{srv.proc.pid}/cmdline", "rb") as f:
            assert token.encode() not in f.read(), "the control token is visible in the server's command line"

        # Watching stays open to the room; the page knows its buttons are locked.
        assert client.get("/dashboard").status_code == 200
        assert client.get("/dashboard/state").json()["controls_locked"] is True

        for headers, code in (({}, "control_token_required"),
                              ({"Authorization": "Bearer not-the-token"}, "control_token_wrong"),
                              ({"Authorization": token}, "control_token_required")):  # no "Bearer"
            r = client.post("/dashboard/control", json={"action": "pause"}, headers=headers)
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert error["type"] == "permission_error" and error["code"] == code, error
            assert "token" in error["message"]
        r = client.post("/dashboard/control", json={"action": "burst", "n": 5})
        assert r.status_code == 403 and client.get("/dashboard/state").json()["stats"]["num_waiting"] == 0
        assert client.get("/health").json()["paused"] is False, "a refused pause paused the engine"

        mine = {"Authorization": f"Bearer {token}"}
        assert client.post("/dashboard/control", json={"action": "pause"}, headers=mine).json()["paused"] is True
        health = client.get("/health")  # the engine runs in its own process: the API side still knows
        assert health.status_code == 200 and health.json()["paused"] is True
        assert paused_gauge(client) == 1
        thread, result = answer_in_background(srv.url)
        wait_until(lambda: client.get("/dashboard/state").json()["stats"]["num_waiting"] == 1,
                   what="the request to queue")
        assert client.post("/dashboard/control", json={"action": "resume"}, headers=mine).status_code == 200
        thread.join(30)
        assert result["status"] == 200
        assert client.get("/health").json()["paused"] is False and paused_gauge(client) == 0
