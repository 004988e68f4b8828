"""The dashboard in a real browser: Debian's Chromium driven by Playwright's Python package
(launched with `executable_path`; `playwright install` is never needed). The page loads,
updates while load runs, and its controls change the engine."""
from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
aiohttp = pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.serve.launch import ServerThread  # noqa: E402
from serve_support import wait_until  # noqa: E402

CHROMIUM = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
TIMEOUT_MS = 15_000


def background_load(url: str, stop: threading.Event, users: int = 8) -> threading.Thread:
    """`users` clients asking one after another until `stop` is set."""

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async def user(i):
                while not stop.is_set():
                    body = {"prompt": f"countdown: {20 + i}", "max_tokens": 60, "temperature": 0, "stream": True}
                    async with session.post(url + "/v1/completions", json=body) as r:
                        await r.read()

            await asyncio.gather(*(user(i) for i in range(users)))

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_dashboard_loads_updates_under_load_and_its_controls_drive_the_engine():
    model, tokenizer = load_tiny()
    stop = threading.Event()
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=16)), tokenizer) as srv:
        loop = srv.loop
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(srv.url + "/dashboard")
                page.wait_for_function("document.body.dataset.step !== undefined", timeout=TIMEOUT_MS)
                assert page.text_content("#status") == "RUNNING"
                assert page.input_value("#admission") == "watermark"

                # Updates while load runs: the step counter climbs, seats and pages fill.
                load = background_load(srv.url, stop)
                start = int(page.get_attribute("body", "data-step"))
                page.wait_for_function(f"Number(document.body.dataset.step) > {start + 30}", timeout=TIMEOUT_MS)
                page.wait_for_function("document.getElementById('running').textContent.split(' / ')[0] !== '0'",
                                       timeout=TIMEOUT_MS)
                coloured = page.evaluate("""() => {
                    const c = document.getElementById('pool'), d = c.getContext('2d')
                        .getImageData(0, 0, c.width, c.height).data;
                    let n = 0;
                    for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i] - d[i + 1]) > 40 || Math.abs(d[i + 1] - d[i + 2]) > 40) n++;
                    return n;
                }""")
                assert coloured > 0, "the page-pool grid shows no request's colour under load"

                # Controls change the engine.
                page.select_option("#admission", "reserve")
                wait_until(lambda: loop.engine.config.admission == "reserve", what="admission to switch")
                page.click("#pause")
                page.wait_for_function("document.getElementById('status').textContent === 'PAUSED'",
                                       timeout=TIMEOUT_MS)
                assert loop.paused
                paused_at = loop.num_steps
                time.sleep(0.3)
                assert loop.num_steps == paused_at, "a paused engine kept stepping"
                page.fill("#burst-n", "7")
                waiting_before = loop.engine.stats()["num_waiting"]
                page.click("#burst")
                wait_until(lambda: loop.engine.stats()["num_waiting"] == waiting_before + 7, what="the burst to queue")
                page.click("#single-step")
                wait_until(lambda: loop.num_steps == paused_at + 1, what="one single step")
                page.wait_for_function(f"Number(document.body.dataset.step) === {paused_at + 1}", timeout=TIMEOUT_MS)
                page.click("#pause")  # now labelled Resume
                page.wait_for_function("document.getElementById('status').textContent === 'RUNNING'",
                                       timeout=TIMEOUT_MS)
                wait_until(lambda: loop.num_steps > paused_at + 5, what="the engine to run again")
                assert not errors, f"JavaScript errors on the page: {errors}"
            finally:
                stop.set()
                browser.close()
        load.join(30)
        wait_until(lambda: not loop.engine.has_unfinished_requests, what="the load to drain")
        assert loop.engine.pool.num_free_pages == loop.engine.pool.num_pages
