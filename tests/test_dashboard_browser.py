"""The dashboard in a real browser: Debian's Chromium driven by Playwright's Python package
(launched with `executable_path`; `playwright install` is never needed). The page loads,
updates while load runs, and its controls change the engine. On a projector (1280x720) it is one
screen with every label in view and readable text, neighbouring requests never share a colour, the
turnstile scrolls at a readable pace however fast the engine steps, and a pause is plain to see."""
from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
aiohttp = pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

from course_lib import EngineConfig, LLMEngine, load_tiny  # noqa: E402
from course_lib.serve.dashboard import STATIC  # noqa: E402
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


# ------------------------------------------------------------------------------------ the projector
PROJECTOR = {"width": 1280, "height": 720}
CANVAS_BACKGROUND = "#0a0c0f"  # dashboard.css's --canvas: what request colours are drawn on


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


def script_page(browser, *scripts: str):
    """A blank page with some of the dashboard's scripts loaded (their classes, no server)."""
    page = browser.new_page()
    page.set_content("<!doctype html><html><body></body></html>")
    for name in scripts:
        page.add_script_tag(path=str(STATIC / name))
    return page


def luminance(hex_colour: str) -> float:
    """WCAG relative luminance of '#rrggbb'."""
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_request_colours_are_a_palette_handed_out_in_arrival_order(browser):
    page = script_page(browser, "colours.js")
    palette = page.evaluate("PALETTE")
    assert len(set(c.lower() for c in palette)) == len(palette) >= 7
    for colour in palette:  # WCAG's 3:1 for graphics, on the canvas they are drawn on
        assert contrast(colour, CANVAS_BACKGROUND) >= 3.0, f"{colour} washes out on {CANVAS_BACKGROUND}"
    # The order of arrival decides, not the id: the same id first in line gets the first colour.
    assert page.evaluate("(() => { const c = new RequestColours(); return [c.assign('b'), c.assign('a')]; })()") \
        == palette[:2]
    assert page.evaluate("(() => { const c = new RequestColours(); return [c.assign('a'), c.assign('b')]; })()") \
        == palette[:2]
    sequence = page.evaluate("""(() => { const c = new RequestColours();
        return Array.from({length: 300}, (_, i) => c.assign(`cmpl-f00${i}`)); })()""")
    assert all(a != b for a, b in zip(sequence, sequence[1:])), "two consecutive requests share a colour"
    assert sequence[:len(palette)] == palette


def test_neighbouring_cells_of_the_turnstile_never_share_a_colour(browser):
    """Random arrivals and departures over 64 seats: at every step, each request's colour differs from
    the requests above and below it and from the one that held its seat the step before."""
    page = script_page(browser, "colours.js")
    rng = random.Random(0)
    seats, columns, holder, next_id = 64, [], [None] * 64, 0
    for _ in range(400):
        for seat in range(seats):
            if holder[seat] is not None and rng.random() < 0.15:
                holder[seat] = None
            elif holder[seat] is None and rng.random() < 0.5:
                holder[seat], next_id = f"cmpl-{next_id}", next_id + 1
        columns.append([[rid, "decode"] if rid else None for rid in holder])
    clashes = page.evaluate("""(columns) => {
        const c = new RequestColours(), clashes = [];
        let before = [];
        for (const column of columns) {
            c.assignSeats(column, before);
            column.forEach((cell, seat) => {
                if (!cell) return;
                for (const other of [column[seat + 1], before[seat]]) {
                    if (other && other[0] !== cell[0] && c.colour(other[0]) === c.colour(cell[0])) {
                        clashes.push([cell[0], other[0], seat]);
                    }
                }
            });
            before = column;
        }
        return clashes;
    }""", columns)
    assert not clashes, f"neighbours sharing a colour: {clashes[:5]}"


def test_the_turnstile_window_stays_bounded_and_advances_at_580_steps_a_second(browser):
    """Snapshots 4 times a second from an engine at 580 steps a second: 145 steps apart, each carrying
    its last 48 steps. The window takes one column per snapshot, never more than its width."""
    page = script_page(browser, "turnstile_window.js")
    shown = page.evaluate("""() => {
        const w = new TurnstileWindow(), shown = [];
        const snapshot = (step) => Array.from({length: 48}, (_, k) => ({step: step - 47 + k, seats: [null]}));
        for (let i = 1; i <= 200; i++) {
            const added = w.push(snapshot(i * 145));
            const again = w.push(snapshot(i * 145));  // a refresh with no new step (paused): no column
            shown.push([added, again, w.columns.length, w.firstStep, w.lastStep, w.stride()]);
        }
        w.push(snapshot(10));  // a lower step: a new server, start again
        shown.push([true, false, w.columns.length, w.firstStep, w.lastStep, w.stride()]);
        return [w.width, shown];
    }""")
    width, shown = shown
    assert width == 48
    for i, (added, again, n, first, last, stride) in enumerate(shown[:-1], start=1):
        assert added and not again
        assert n == min(i, width), "the window must take one column per refresh and stay within its width"
        assert last == i * 145 and first == max(1, i - width + 1) * 145, "the window must move with the engine"
        assert stride == (145 if i > 1 else 1)
    assert shown[-1][2:5] == [1, 10, 10]


def text_contrasts(page) -> list:
    """[ratio, element, text] for every visible element with text of its own: its colour against
    the first opaque background behind it."""
    return page.evaluate("""() => {
        const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
        const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
        const behind = (el) => { for (; el; el = el.parentElement) {
            const c = rgb(getComputedStyle(el).backgroundColor); if (c.length < 4 || c[3] > 0) return c; }
            return [255, 255, 255]; };
        const out = [];
        for (const el of document.querySelectorAll("body *")) {
            const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
            if (!own || el.tagName === "OPTION" || !el.getClientRects().length) continue;
            const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(behind(el))].sort((x, y) => y - x);
            out.push([(a + 0.05) / (b + 0.05), el.id || el.className || el.tagName,
                      el.textContent.trim().slice(0, 40)]);
        }
        return out;
    }""")


def out_of_view(page, selector: str) -> list:
    """The elements matching `selector` that are not wholly inside the viewport, or hidden under
    something else (what is at their centre is not them)."""
    return page.evaluate("""(selector) => [...document.querySelectorAll(selector)].filter((el) => {
        const r = el.getBoundingClientRect();
        if (!r.width || !r.height || r.top < 0 || r.left < 0) return true;
        if (r.bottom > innerHeight || r.right > innerWidth) return true;
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return !(hit && (el.contains(hit) || hit.contains(el)));
    }).map((el) => el.id || el.textContent.trim().slice(0, 40))""", selector)


KEY_NUMBERS = ("throughput", "ttft", "tpot", "running", "pages", "preemptions")


def assert_one_screen(page, shot: Path) -> None:
    size = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight, "
                         "document.body.scrollHeight]")
    assert size[0] <= PROJECTOR["width"] and max(size[1:]) <= PROJECTOR["height"], f"page is {size}, not one screen"
    for number in KEY_NUMBERS:  # each key number and the label that says what it is
        assert not out_of_view(page, f"#{number}, #{number} + .unit"), f"{number} or its label is out of view"
    assert not out_of_view(page, "h1, h2, .legend, #status, .controls button, .controls select"), \
        out_of_view(page, "h1, h2, .legend, #status, .controls button, .controls select")
    washed = [c for c in text_contrasts(page) if c[0] < 7.0]
    assert not washed, f"text under 7:1 contrast (WCAG AAA) against its background: {washed}"
    page.screenshot(path=str(shot), full_page=True)
    assert png_size(shot) == (PROJECTOR["width"], PROJECTOR["height"])


def window_state(page) -> dict:
    return page.evaluate("({...document.getElementById('turnstile').dataset})")


@pytest.mark.slow
def test_on_a_projector_the_page_is_one_screen_readable_at_full_speed_and_paused_plainly(browser, tmp_path):
    model, tokenizer = load_tiny()
    stop = threading.Event()
    with ServerThread(LLMEngine(model, EngineConfig()), tokenizer) as srv:  # 64 seats: the default
        loop = srv.loop
        page = browser.new_page(viewport=PROJECTOR)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(srv.url + "/dashboard")
            page.wait_for_function("document.body.dataset.step !== undefined", timeout=TIMEOUT_MS)
            load = background_load(srv.url, stop, users=12)
            page.wait_for_function("Number(document.getElementById('turnstile').dataset.columns) >= 4",
                                   timeout=TIMEOUT_MS)
            page.wait_for_function("document.getElementById('running').textContent.split(' / ')[0] !== '0'",
                                   timeout=TIMEOUT_MS)

            # The turnstile at full speed: one column per refresh, at most its width, moving on.
            samples = []
            for _ in range(8):
                samples.append(window_state(page))
                time.sleep(0.3)
            for s in samples:
                assert 1 <= int(s["columns"]) <= min(48, int(s["frames"]))
            lasts = [int(s["lastStep"]) for s in samples]
            assert lasts == sorted(lasts) and lasts[-1] > lasts[0], f"the turnstile did not advance: {lasts}"
            clashes = page.evaluate("""() => {
                const column = turnstile.columns[turnstile.columns.length - 1].seats, out = [];
                column.forEach((cell, seat) => { const next = column[seat + 1];
                    if (cell && next && colours.colour(cell[0]) === colours.colour(next[0])) out.push(seat); });
                return out; }""")
            assert not clashes, f"neighbouring seats share a colour at seats {clashes}"
            assert_one_screen(page, tmp_path / "dashboard_1280x720_running.png")

            # Paused: a banner says so, and what happens to requests sent meanwhile.
            page.click("#pause")
            page.wait_for_function("document.body.dataset.paused === 'true'", timeout=TIMEOUT_MS)
            stop.set()  # the users' requests in flight wait in the engine until it resumes
            page.fill("#burst-n", "3")
            page.click("#burst")
            wait_until(lambda: loop.stats["num_waiting"] >= 3
                       and f"({loop.stats['num_waiting']} now)" in page.text_content("#paused-note"),
                       what="the banner to count the requests waiting")
            note = page.text_content("#paused-note")
            assert "PAUSED" in note and "wait in the queue" in note and "Resume" in note
            assert not out_of_view(page, "#paused-note")
            assert_one_screen(page, tmp_path / "dashboard_1280x720_paused.png")
            page.click("#pause")  # Resume
            page.wait_for_function("document.body.dataset.paused === 'false'", timeout=TIMEOUT_MS)
            assert page.is_hidden("#paused-note")
            assert not errors, f"JavaScript errors on the page: {errors}"
        finally:
            stop.set()
            page.close()
        load.join(30)
        wait_until(lambda: not loop.engine.has_unfinished_requests, what="the load to drain")


@pytest.mark.slow
def test_a_page_without_the_token_is_view_only_and_one_with_it_drops_it_from_the_address_bar(browser, tmp_path):
    model, tokenizer = load_tiny()
    with ServerThread(LLMEngine(model, EngineConfig(max_num_seqs=4)), tokenizer) as srv:
        srv.state.control_token = "s3cret-token"  # what `serve --host 0.0.0.0` sets
        page = browser.new_page(viewport=PROJECTOR)
        try:
            page.goto(srv.url + "/dashboard")
            page.wait_for_function("document.body.dataset.step !== undefined", timeout=TIMEOUT_MS)
            assert page.is_visible("#view-only") and page.is_disabled("#pause") and page.is_disabled("#burst")
            assert_one_screen(page, tmp_path / "dashboard_1280x720_view_only.png")

            page.goto(srv.url + "/dashboard?token=s3cret-token")
            page.wait_for_function("document.body.dataset.step !== undefined", timeout=TIMEOUT_MS)
            assert "token" not in page.url, "the token stays in the address bar, on the projector"
            assert page.is_hidden("#view-only") and page.is_enabled("#pause")
            page.click("#pause")
            wait_until(lambda: srv.loop.paused, what="the pause with the token")
            page.wait_for_function("document.getElementById('pause').textContent === 'Resume'", timeout=TIMEOUT_MS)
            page.click("#pause")
            wait_until(lambda: not srv.loop.paused, what="the resume with the token")
            page.wait_for_function("document.getElementById('pause').textContent === 'Pause'", timeout=TIMEOUT_MS)

            srv.state.control_token = "another-token"  # a stale token: refused, said on the page, forgotten
            page.click("#pause")
            page.wait_for_function("!document.getElementById('error-note').hidden", timeout=TIMEOUT_MS)
            assert "wrong control token" in page.text_content("#error-note")
            assert not srv.loop.paused
            page.wait_for_function("!document.getElementById('view-only').hidden", timeout=TIMEOUT_MS)
        finally:
            page.close()
