"""Every student notebook in a real JupyterLab, in a real (headless) browser, run with Run All.

JupyterLab starts on a free 127.0.0.1 port with a token, no browser of its own, and its config,
settings, workspaces and runtime files in a temporary folder; Debian's Chromium (/usr/bin/chromium,
installed by scripts/setup.sh) is driven by Playwright's Python package through `executable_path`
(no browser download). JupyterLab serves a copy of notebooks/, every exercise unfinished, as a new
student opens it. One server, the notebooks one after the other (each kernel shut down before the
next opens), in FAST mode (`COURSE_FAST=1`, what the notebooks do on a CPU anyway). Run All is
clicked from the Run menu once JupyterLab enables it, and again (up to three clicks) if no cell
starts; the report names a notebook that took more than one. After Run All:

- the run reached the last cell (every code cell has run: Run All did not stop early);
- the only error outputs are NotImplementedErrors of unfinished exercises, in cells tagged
  raises-exception (JupyterLab runs on past those);
- every slider the code makes renders as a slider: no "Error displaying widget", no widget shown
  as its text repr;
- in every cell that shows sliders, moving the first one (one step, with the keyboard) redraws
  that cell's figure.

The server's process group (server and kernels) and the browser are stopped at the end, whatever
happened. Each notebook's Run All time (wall, and its kernel's CPU) is printed at the end of the run.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
RUN_ALL_TIMEOUT_S = 600  # one notebook's Run All, on a busy 2-core machine
REDRAW_TIMEOUT_S = 120  # one slider move's redraw
STALL_S = 30  # no cell run for this long, kernel idle: Run All stopped early

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (scripts/setup.sh installs it)")]


def _assignments() -> list[str]:
    """The student notebooks there are (a notebook added later is picked up by its folder)."""
    return sorted(p.name for p in (ROOT / "notebooks").iterdir() if (p / f"{p.name}.ipynb").exists())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# ------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def student_notebooks(tmp_path_factory) -> Path:
    """A copy of notebooks/ (what a student opens: test_notebooks.py checks it is generated from
    solutions/ and stores no outputs), so that what the run saves touches nothing in the repo."""
    out = tmp_path_factory.mktemp("lab") / "notebooks"
    shutil.copytree(ROOT / "notebooks", out)
    return out


class Lab:
    def __init__(self, base: str, token: str, server: subprocess.Popen):
        self.base, self.token, self.server = base, token, server
        self.times: dict[str, tuple[float, float]] = {}  # notebook -> (Run All wall s, kernel CPU s)

    def kernels(self) -> dict[int, list[str]]:
        """{pid: /proc/pid/stat fields after the name} of the server's kernels (its children
        running ipykernel; jupyter_server starts each in a session of its own)."""
        found = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                cmdline = (stat.parent / "cmdline").read_bytes()
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if b"ipykernel" in cmdline and int(fields[1]) == self.server.pid:  # fields[1]: parent pid
                found[int(stat.parent.name)] = fields
        return found

    def kernel_cpu_s(self) -> float:
        """CPU seconds (user + system, with waited-for children such as the C compiler) of the
        server's kernels; one at a time here, so: this notebook's."""
        ticks = sum(int(f) for fields in self.kernels().values() for f in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def lab(student_notebooks, tmp_path_factory, request):
    """A JupyterLab serving the student notebooks; stopped (with its kernels) afterwards."""
    home = tmp_path_factory.mktemp("lab-home")
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # Render every cell (no virtual scrolling), so that the page holds every output to look at.
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    announcements = home / "settings" / "@jupyterlab" / "apputils-extension"
    announcements.mkdir(parents=True)
    (announcements / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "IPYTHONDIR": str(home / "ipython"), "OMP_NUM_THREADS": "1", "COURSE_FAST": "1"}
    log = open(home / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={student_notebooks}", "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group: kernels too
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    lab = Lab(base, token, server)
    try:
        def up():
            if server.poll() is not None:
                raise AssertionError(f"jupyter lab exited: {(home / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait_until(up, 120, "JupyterLab to answer")
        lab.times["(server start)"] = (time.monotonic() - started, 0.0)
        yield lab
    finally:
        kernels = list(lab.kernels())
        _stop_group(server)
        for pid in kernels:  # any kernel the server did not shut down (each in its own group)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        _report(request.config, lab.times)


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (server and kernels), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # kernels that outlived the server
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


def _report(config, times: dict) -> None:
    """The times, in the terminal (not captured): CI's log says what this test costs."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not times:
        return
    with capture.global_and_fixture_disabled():
        _write_times(reporter, times)


def _write_times(reporter, times: dict) -> None:
    reporter.write_line("")
    reporter.write_line("JupyterLab Run All (FAST mode): wall s | kernel CPU s")
    for name, (wall, cpu) in times.items():
        reporter.write_line(f"  {name:28s} {wall:6.1f} | {cpu:6.1f}")
    reporter.write_line(f"  {'total':28s} {sum(w for w, _ in times.values()):6.1f} |"
                        f" {sum(c for _, c in times.values()):6.1f}")


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield chromium
        finally:
            chromium.close()


# ------------------------------------------------------------------------------- the page
# What the page is asked, in JupyterLab's own model (window.jupyterapp: expose_app_in_browser).
JS_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.sessionContext) return null;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const cells = [];
  for (const cell of panel.content.widgets) {
    const m = cell.model;
    if (m.type !== 'code') continue;
    cells.push({count: m.executionCount, tags: m.getMetadata('tags') || [],
                outputs: m.outputs.toJSON().map(o => ({type: o.output_type, ename: o.ename || null,
                                                         evalue: (o.evalue || '').slice(0, 300)}))});
  }
  const running = Array.from(document.querySelectorAll('.jp-InputPrompt')).some(e => e.textContent.includes('*'));
  return {kernel: kernel ? kernel.status : 'none', cells, running};
}"""

JS_KERNEL_IDLE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  return !!(session && session.kernel && session.kernel.status === 'idle');
}"""


def _open(page, lab: Lab, relpath: str) -> None:
    page.goto(f"{lab.base}/lab/tree/{relpath}?token={lab.token}", wait_until="domcontentloaded")
    _wait_until(lambda: page.evaluate(JS_KERNEL_IDLE), 120, f"{relpath} to open with an idle kernel")


JS_RUN_ALL_ENABLED = """() => !!(window.jupyterapp && window.jupyterapp.commands.isEnabled('notebook:run-all-cells'))"""

JS_STARTED = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return panel.content.widgets.some(c => c.model.type === 'code' && c.model.executionCount !== null)
      || Array.from(document.querySelectorAll('.jp-InputPrompt')).some(e => e.textContent.includes('*'))
      || !!(kernel && kernel.status === 'busy');
}"""

JS_WHAT_IS_SHOWN = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  const dialog = document.querySelector('.jp-Dialog');
  return {kernel: session && session.kernel ? session.kernel.status : 'none',
          dialog: dialog ? dialog.innerText.slice(0, 300) : null};
}"""

RUN_ALL_TRIES = 3
RUN_ALL_START_S = 30  # a first cell queued within this long of the click, or the click did not take


def _run_all(page) -> int:
    """Run > Run All Cells, from the menu bar as a student does; the number of clicks it took.

    Once in a CI run (1 in ~80 notebooks), the click ran nothing: no cell queued, the kernel idle.
    So: wait until JupyterLab enables the command (the notebook is the current widget), click,
    and see that a cell starts; if none does, close the menu and click again, as a student would.
    """
    _wait_until(lambda: page.evaluate(JS_RUN_ALL_ENABLED), 60, "Run All Cells to be enabled")
    for attempt in range(1, RUN_ALL_TRIES + 1):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            _wait_until(lambda: page.evaluate(JS_STARTED), RUN_ALL_START_S, "a first cell to start")
            return attempt
        except AssertionError:
            page.keyboard.press("Escape")  # a menu left open
    seen = page.evaluate(JS_WHAT_IS_SHOWN)
    raise AssertionError(f"Run > Run All Cells started no cell in {RUN_ALL_TRIES} clicks, {RUN_ALL_START_S} s apart; "
                         f"kernel {seen['kernel']}, dialog: {seen['dialog']!r}")


def _settled(page, progress: dict):
    """The state once Run All is over. JupyterLab 4 runs the cells one after the other (the kernel
    is idle for a moment between two), so: the last cell has run and the kernel is idle; or the run
    stopped early (at an error JupyterLab does not run past): idle, and no cell has run for
    STALL_S seconds."""
    state = page.evaluate(JS_STATE)
    if not state or state["kernel"] != "idle" or state["running"] or not state["cells"]:
        return None
    if state["cells"][-1]["count"] is not None:
        return state
    counts = [c["count"] for c in state["cells"]]
    if counts != progress.get("counts"):
        progress.update(counts=counts, since=time.monotonic())
        return None
    return state if time.monotonic() - progress["since"] > STALL_S else None


JS_WIDGET_CELLS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.widgets.filter(c => c.model.type === 'code').map((cell, i) => {
    const out = cell.node.querySelector('.jp-Cell-outputArea') || cell.node;
    const text = out.innerText;
    const slider = out.querySelector('.widget-slider');
    const img = out.querySelector('img');
    return {index: i, sliders: out.querySelectorAll('.widget-slider').length,
            error_displaying: text.includes('Error displaying widget'),
            as_text: /\\b(interactive|FloatSlider|IntSlider|SelectionSlider|VBox|HBox)\\(/.test(text),
            figure: slider && img ? img.src : null};
  });
}"""


def _expected_sliders(source: str) -> int:
    """Sliders a cell's code makes: each `...Slider(` call, and the three of a simulation dashboard
    (page size, load, KV pool: course_lib.viz.widgets.simulation_dashboard)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("#", "def ")))
    return len(re.findall(r"Slider\(", code)) + 3 * len(re.findall(r"simulation_dashboard\(", code))


def _move_first_slider(page, code_cell_index: int) -> None:
    """One step to the right, with the keyboard, on the first slider of that code cell."""
    handle = page.evaluate_handle("""(i) => {
      const cells = window.jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code');
      return cells[i].node.querySelector('.widget-slider .noUi-handle');
    }""", code_cell_index).as_element()
    assert handle is not None, f"code cell {code_cell_index}: its slider has no handle to move"
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.keyboard.press("ArrowRight")


def _figure_of(page, code_cell_index: int):
    return page.evaluate(JS_WIDGET_CELLS)[code_cell_index]["figure"]


# ------------------------------------------------------------------------------- the test
@pytest.mark.parametrize("assignment", _assignments())
def test_run_all_in_jupyterlab(lab, browser, student_notebooks, assignment):
    nb = nbformat.read(student_notebooks / assignment / f"{assignment}.ipynb", as_version=4)
    code_sources = [c.source for c in nb.cells if c.cell_type == "code"]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        _open(page, lab, f"{assignment}/{assignment}.ipynb")
        started = time.monotonic()
        clicks = _run_all(page)
        progress = {}
        state = _wait_until(lambda: _settled(page, progress), RUN_ALL_TIMEOUT_S, f"Run All of {assignment} to finish", 1.0)
        name = assignment if clicks == 1 else f"{assignment} ({clicks} clicks)"
        lab.times[name] = (time.monotonic() - started, lab.kernel_cpu_s())

        assert len(state["cells"]) == len(code_sources)
        unrun = [i for i, c in enumerate(state["cells"]) if c["count"] is None]
        errors = [f"code cell {i}: {o['ename']}: {o['evalue']}" for i, c in enumerate(state["cells"])
                  for o in c["outputs"] if o["type"] == "error"]
        assert not unrun, f"Run All stopped: code cells {unrun} never ran; errors:\n" + "\n".join(errors)
        unexpected = [f"code cell {i}: {o['ename']}: {o['evalue']}" for i, c in enumerate(state["cells"])
                      for o in c["outputs"] if o["type"] == "error"
                      and not (o["ename"] == "NotImplementedError" and "raises-exception" in c["tags"])]
        assert not unexpected, "errors other than unfinished exercises:\n" + "\n".join(unexpected)

        rendered = page.evaluate(JS_WIDGET_CELLS)
        assert len(rendered) == len(code_sources)
        for i, (source, cell) in enumerate(zip(code_sources, rendered)):
            assert not cell["error_displaying"], f"code cell {i} shows 'Error displaying widget'"
            assert not cell["as_text"], f"code cell {i} shows a widget as text (its repr), not rendered"
            expected = _expected_sliders(source)
            assert cell["sliders"] >= expected, f"code cell {i}: {cell['sliders']} sliders rendered, its code makes {expected}"
            if expected:
                before = cell["figure"]
                assert before, f"code cell {i}: its sliders show no figure"
                _move_first_slider(page, i)
                _wait_until(lambda: _figure_of(page, i) not in (None, before), REDRAW_TIMEOUT_S,
                            f"code cell {i}'s figure to change after moving its slider")
    finally:
        try:  # shut this notebook's kernel down, so the next one has the CPU to itself
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        except Exception:
            pass
        context.close()
