"""`python -m course_lib serve` steps its engine in a process of its own (engine_process.py): the
same answers, errors, hang-ups, dashboard controls and metrics as the engine in a thread
(test_serve_api.py covers those in depth), across the pipe; and when the engine process dies, every
client hears why at once and /health says so. Each server is a real subprocess on a free port."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from course_lib import load_tiny  # noqa: E402
from course_lib.loadgen.scrape import parse_prometheus  # noqa: E402
from course_lib.serve.launch import ServerProcess  # noqa: E402
from serve_support import engine_process_of, in_process, wait_until  # noqa: E402

LINUX = sys.platform.startswith("linux")
PROMPTS = ["add 12 and 30", "reverse abc", "what is 7 times 6?"]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--max-num-seqs", "4", "--num-pages", "12", "--max-waiting", "1"]) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def stream_ids(client, body: dict) -> tuple[list[int], list[dict]]:
    ids, events = [], []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True, "return_token_ids": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                events.append(event)
                for choice in event.get("choices", []):
                    ids += choice.get("token_ids") or []
    return ids, events


def metric(client, name: str) -> float:
    return parse_prometheus(client.get("/metrics").text)[name]


def control(client, action: str, **kw) -> dict:
    r = client.post("/dashboard/control", json={"action": action, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_answers_equal_the_engine_in_process_streamed_or_not(tiny, client):
    for text in PROMPTS:
        want = in_process(tiny, text, 12, ignore_eos=True)
        body = {"model": "tiny", "prompt": text, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
        whole = client.post("/v1/completions", json={**body, "return_token_ids": True})
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["token_ids"] == want
        assert whole.json()["usage"]["completion_tokens"] == 12
        streamed, events = stream_ids(client, body)
        assert streamed == want
        assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_engine_side_rejection_comes_back_as_a_400_naming_the_limit(client):
    # 12 pages of 16 tokens hold 192 tokens: a 250-token prompt fits the model (256) but never the pool.
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5] * 250, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "192" in error["message"] or "12 pages" in error["message"], error["message"]
    assert client.get("/health").status_code == 200


def test_pause_step_admission_burst_and_a_full_queue_across_the_pipe(client):
    control(client, "pause")
    try:
        steps = client.get("/dashboard/state").json()["step"]
        body = {"model": "tiny", "prompt": "add 1 and 2", "max_tokens": 4, "ignore_eos": True}
        with httpx.Client(base_url=str(client.base_url), timeout=60) as other:
            with other.stream("POST", "/v1/completions", json={**body, "stream": True}) as first:
                assert first.status_code == 200  # admitted: waits in the queue while paused
                wait_until(lambda: client.get("/dashboard/state").json()["stats"]["num_waiting"] == 1,
                           what="the request to wait")
                full = client.post("/v1/completions", json=body)
                assert full.status_code == 429, full.text
                assert full.headers.get("retry-after") == "1"
                assert full.json()["error"]["code"] == "queue_full"
                assert client.get("/dashboard/state").json()["step"] == steps, "a paused engine stepped"
                control(client, "step")
                wait_until(lambda: client.get("/dashboard/state").json()["step"] == steps + 1, what="one step")
                control(client, "resume")
                text = "".join(first.iter_text())
                assert "[DONE]" in text
        assert control(client, "admission", policy="reserve")["admission"] == "reserve"
        bad = client.post("/dashboard/control", json={"action": "admission", "policy": "fifo"})
        assert bad.status_code == 400 and "watermark" in bad.json()["error"]["message"]
        control(client, "pause")
        assert control(client, "burst", n=3)["injected"] == 1  # the queue holds one (--max-waiting 1)
        assert client.get("/dashboard/state").json()["stats"]["num_waiting"] == 1
    finally:
        control(client, "resume")
        control(client, "admission", policy="watermark")
    wait_until(lambda: metric(client, "course_lib_num_requests_waiting") == 0
               and metric(client, "course_lib_num_requests_running") == 0, what="the burst to drain")


def test_a_client_hanging_up_mid_stream_frees_its_pages(client):
    body = {"model": "tiny", "prompt": "reverse abcdef", "max_tokens": 150, "ignore_eos": True, "stream": True}
    control(client, "pause")  # the engine moves one step at a time: only the hang-up can end the answer
    try:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as other:
            with other.stream("POST", "/v1/completions", json=body) as r:
                wait_until(lambda: metric(client, "course_lib_num_requests_waiting") == 1, what="the request to queue")
                control(client, "step")  # its prefill: the first token
                lines = r.iter_lines()  # kept: a dropped line iterator closes the response (a hang-up)
                assert next(line for line in lines if line.startswith("data: "))
                assert metric(client, "course_lib_num_requests_running") == 1
                assert metric(client, "course_lib_kv_pages_used") > 0
            # leaving the block closed the connection mid-answer
        wait_until(lambda: metric(client, "course_lib_kv_pages_used") == 0
                   and metric(client, "course_lib_num_requests_running") == 0, what="the pages to come back")
        assert metric(client, "course_lib_kv_pages_free") == metric(client, "course_lib_kv_pages_total") == 12
        assert 'course_lib_requests_finished_total{finish_reason="aborted"} 1.0' in client.get("/metrics").text
    finally:
        control(client, "resume")


def test_a_config_the_engine_refuses_stops_the_command_with_its_reason():
    run = subprocess.run([sys.executable, "-m", "course_lib", "serve", "--port", "0", "--page-size", "0"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 2, run.stderr
    assert "page_size" in run.stderr or "page size" in run.stderr, run.stderr


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_when_the_engine_process_dies_clients_hear_why_and_health_fails():
    with ServerProcess(["--max-num-seqs", "2", "--no-dashboard"]) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            pid = engine_process_of(srv.proc.pid)
            # 13 prompt tokens + 240 fit the 256-token context (more is refused, not clamped)
            body = {"model": "tiny", "prompt": "reverse abc", "max_tokens": 240, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                os.kill(pid, signal.SIGKILL)
                rest = [line for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2][6:])["error"]
            assert "engine process stopped" in error["message"], error
            assert c.get("/health").status_code == 503
            refused = c.post("/v1/completions", json={"model": "tiny", "prompt": "add 1 and 2", "max_tokens": 2})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_down"
            assert c.get("/metrics").status_code == 503


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_stopping_the_server_stops_its_engine_process():
    srv = ServerProcess(["--max-num-seqs", "2", "--no-dashboard"])
    pid = engine_process_of(srv.proc.pid)
    srv.stop()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the engine process outlived its server"


def test_a_flood_of_requests_never_wedges_the_two_pipes(server, client):
    """600 requests at once while the engine is paused, ~1 KB of command each (ten times what a pipe
    buffers), almost all refused with a 429: every request gets its answer, in bounded time, and the
    server stays up."""
    aiohttp = pytest.importorskip("aiohttp")
    import asyncio

    body = {"model": "tiny", "prompt": [7] * 150, "max_tokens": 2}

    async def flood():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one():
                async with session.post(server.url + "/v1/completions", json=body) as r:
                    await r.read()
                    return r.status

            tasks = [asyncio.ensure_future(one()) for _ in range(600)]
            await asyncio.sleep(1.0)
            control(client, "resume")  # the one admitted while paused may now run
            return await asyncio.wait_for(asyncio.gather(*tasks), 90)

    control(client, "pause")
    try:
        statuses = asyncio.run(flood())
    finally:
        control(client, "resume")
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(200) >= 1 and statuses.count(429) >= 500, (statuses.count(200), statuses.count(429))
    assert client.get("/health").status_code == 200
    wait_until(lambda: metric(client, "course_lib_kv_pages_used") == 0, what="the pool to empty")


def test_commands_never_block_the_event_loop_and_arrive_whole_and_in_order():
    """The API side's command writes into a pipe nobody reads yet: the event loop keeps running (the
    rest waits in memory), and once the engine side reads, every frame arrives whole and in order."""
    import asyncio
    import threading

    from course_lib.serve.engine_process import EngineClient, read_frame

    read_end, write_end = os.pipe()
    client = EngineClient.__new__(EngineClient)  # the pipe half alone, no engine process
    client._fd, client._pending, client._writer_loop, client._gone_reason = write_end, bytearray(), None, None
    os.set_blocking(write_end, False)
    messages = [("add", f"r{i}", list(range(i % 300)), None) for i in range(400)]  # ~300 KB of frames
    received = []

    async def main():
        for m in messages:
            client._send(m)  # would block on a full pipe if it wrote the blocking way
        assert client._pending, "a pipe holds ~64 KB: the rest should be waiting in memory"
        assert client._writer_loop is not None
        reader = threading.Thread(target=lambda: received.extend(read_frame(read_end) for _ in messages))
        reader.start()
        deadline = time.monotonic() + 30
        while client._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the loop stays free; add_writer drains the rest
        reader.join(30)

    try:
        asyncio.run(main())
    finally:
        os.close(read_end)
        os.close(write_end)
    assert received == messages
    assert not client._pending and client._writer_loop is None


def test_the_output_pipe_reader_waits_for_a_frame_that_arrives_in_pieces():
    """Under load the engine's write of one message can reach the HTTP side in several reads (the
    event loop makes its end non-blocking): a first part waits, nothing is lost or misread. This is
    what Connection.recv got wrong (BlockingIOError mid-message, taken for the engine's death)."""
    from course_lib.serve.engine_process import EngineClient, frame_bytes

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    client = EngineClient.__new__(EngineClient)  # the pipe half alone, no engine process

    class End:
        def fileno(self):
            return read_end

    handled = []
    client._outputs, client._inbox, client._handle = End(), bytearray(), handled.append
    big = ("out", [(f"r{i}", list(range(50))) for i in range(300)], 7, 0.5)  # ~60 KB
    frames = frame_bytes(("answer", 1, True, {"x": 1})) + frame_bytes(big) + frame_bytes(("answer", 2, True, None))
    try:
        client._readable()  # nothing there yet: no error, nothing handled
        assert handled == []
        pieces = [frames[:3], frames[3:40], frames[40:20000], frames[20000:-5], frames[-5:]]
        for i, piece in enumerate(pieces):
            os.write(write_end, piece)
            while True:  # read everything that is there, as the event loop would
                before = len(client._inbox), len(handled)
                client._readable()
                if (len(client._inbox), len(handled)) == before:
                    break
            if i < len(pieces) - 1:
                assert len(handled) < 3, "a frame was handled before all of it arrived"
    finally:
        os.close(read_end)
        os.close(write_end)
    assert handled == [("answer", 1, True, {"x": 1}), big, ("answer", 2, True, None)]
    assert not client._inbox
