"""What comes back from a sandbox's run: the runner's whitelisted report, nothing else.

The runner (`autograder.sandbox_exec`, the grader's code, started before any of the student's)
writes one line per finished cell to a pipe only it holds (its original stdout: the kernel and
everything the student starts get another fd 1), each line `<nonce> <json>`: the nonce came on
its stdin with the notebook, before any student code ran. A line without it is not the runner's.

From the first test cell with hidden tests on, the student's code has been able to see hidden
inputs (and IPython's input history holds the hidden code from the moment that cell starts), so
no output of those cells comes back at all: only the cell's status, and for a graded test cell a
summary in the grader's vocabulary (which error, if it is one of a few kinds; whether the guard's
completion marker was printed; whether anything went to stderr; which of the cell's *visible*
constant assert messages it raised, by number). The cells before it come back whole (capped):
each as it was when it finished (later display updates are not applied), since what they show was
computed before any hidden input existed in the sandbox.

An integrity violation found after that point keeps its details in the sandbox; the runner adds a
cell of its own just before the first hidden test (`PROBE_META`) that asks the guard for what it
has found so far, which comes back with the cells before it.
"""
from __future__ import annotations

import ast
import json

STATUSES = ("ok", "error", "timeout", "crashed", "not_run", "skipped")
KERNEL_ERRORS = ("AssertionError", "NotImplementedError")  # named as they are; any other is "Error"
RUNNER_ERRORS = ("CellTimeoutError", "DeadKernelError")  # errors the runner itself appends to a cell
PROBE_META = "integrity_probe"  # metadata.autograder key of the runner's probe cell
MAX_LINE_BYTES = 32 << 20
OUTPUTS_BUDGET = 48 << 20  # all cells' outputs together: beyond it a cell's outputs are replaced by a note
OUTPUT_TYPES = ("stream", "display_data", "execute_result", "error")
INTEGRITY = "integrity violation: "
# A check's refusal of course_lib's or the answer key's code: said by its kind alone (the rest of the
# message names a function the student's code chose to call).
REFUSALS = {"course_lib": "uses course_lib's reference implementation instead of your own",
            "autograder": "uses the autograder's reference implementation instead of your own"}


# ------------------------------------------------------------------------------- shared by both sides


def _original(cell) -> str:
    meta = cell.get("metadata", {}).get("autograder", {})
    return meta.get("original_source") or cell.get("source", "")


def visible_assert_messages(source: str) -> list[str]:
    """The constant messages of the `assert` statements outside the hidden blocks of a test cell,
    in order: known to the student already (the released notebook shows them)."""
    from .notebook_cells import hidden_line_ranges

    ranges = hidden_line_ranges(source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    messages = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assert) and isinstance(node.msg, ast.Constant) and isinstance(node.msg.value, str)
                and not any(first <= node.lineno <= last for first, last in ranges)):
            messages.append(node.msg.value)
    return messages


def first_hidden_cell(nb) -> int:
    """Index of the first graded test cell with hidden tests (len(cells) if none)."""
    from .notebook_cells import hidden_line_ranges, is_test_cell

    for index, cell in enumerate(nb.cells):
        if is_test_cell(cell) and hidden_line_ranges(_original(cell)):
            return index
    return len(nb.cells)


def findings(evalue: str) -> list[str]:
    """The guard's findings in an integrity-violation message."""
    if not isinstance(evalue, str) or not evalue.startswith(INTEGRITY):
        return []
    body = evalue[len(INTEGRITY):].split(". The grader restored", 1)[0]
    return [f for f in body.split("; ") if f]


# ------------------------------------------------------------------------------------ the runner's side


def _marker(cell) -> str | None:
    """The completion marker the guard prints at the end of this test cell (from the call to
    `<guard>.done(grade_id, token)` the grader appended to it), or None."""
    try:
        tree = ast.parse(cell.get("source", ""))
    except (SyntaxError, ValueError, RecursionError):
        return None
    for node in reversed(tree.body):
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "done"
                and len(call.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                for a in call.args)):
            return f"[autograder] {call.args[0].value} ok {call.args[1].value}"
    return None


def test_summary(cell, runner_error, probe_findings: list[str]) -> dict:
    """What comes back of a graded test cell run after hidden inputs could be seen."""
    outputs = cell.get("outputs", [])
    summary: dict = {}
    if runner_error is not None:
        summary["runner_error"] = {"ename": runner_error["ename"], "evalue": runner_error["evalue"]}
    errors = [o for o in outputs if o.get("output_type") == "error" and o is not runner_error]
    if errors:
        ename, evalue = str(errors[0].get("ename", "")), str(errors[0].get("evalue", ""))
        summary["error"] = ename if ename in KERNEL_ERRORS else "Error"
        if ename == "AssertionError" and evalue.startswith(INTEGRITY):
            summary["integrity"] = True
            summary["integrity_more"] = bool(set(findings(evalue)) - set(probe_findings))
        elif ename == "AssertionError":
            messages = visible_assert_messages(_original(cell))
            if evalue in messages:
                summary["message"] = messages.index(evalue)
            for which, words in REFUSALS.items():
                if words in evalue:
                    summary["refusal"] = which
    summary["stderr"] = any(o.get("output_type") == "stream" and o.get("name") == "stderr" and str(o.get("text", "")).strip()
                            for o in outputs)
    marker = _marker(cell)
    stdout = "".join(str(o.get("text", "")) for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    summary["marker"] = marker is not None and marker in stdout.splitlines()
    return summary


class Reporter:
    """The runner's end of the channel: one line per finished cell, then one when all is done."""

    def __init__(self, write, nonce: str, nb, outputs_before: int, cap_outputs):
        self.write, self.nonce, self.nb, self.outputs_before = write, nonce, nb, outputs_before
        self.cap_outputs = cap_outputs
        self.probe_findings: list[str] = []
        self.budget = OUTPUTS_BUDGET  # (so that the statuses that follow always fit in what the grader reads)

    def _send(self, frame: dict) -> None:
        self.write((self.nonce + " " + json.dumps(frame) + "\n").encode("utf-8"))

    def cell_done(self, executor, index: int) -> None:
        from .notebook_cells import is_test_cell

        cell = self.nb.cells[index]
        frame = {"cell": index, "status": executor.status.get(index)}
        if index < self.outputs_before:
            self.cap_outputs(cell)
            size = len(json.dumps(cell.get("outputs", [])))
            if size <= self.budget:
                self.budget -= size
                frame["outputs"] = cell.get("outputs", [])
            else:
                frame["outputs"] = [{"output_type": "stream", "name": "stdout", "text":
                                     f"[outputs dropped: the notebook's outputs are over {OUTPUTS_BUDGET >> 20} MB]\n"}]
            if cell.get("metadata", {}).get("autograder", {}).get(PROBE_META):
                self.probe_findings = [f for o in cell.get("outputs", []) if o.get("output_type") == "error"
                                       for f in findings(str(o.get("evalue", "")))]
        elif is_test_cell(cell):
            frame["test"] = test_summary(cell, executor.runner_errors.get(index), self.probe_findings)
        self._send(frame)

    def finish(self, executor, survivors: int) -> None:
        self._send({"done": True, "status": {str(k): v for k, v in executor.status.items()},
                    "log": executor.log[:200], "restarts": executor.restarts, "survivors": survivors,
                    "seconds": getattr(executor, "timings", {})})


# ------------------------------------------------------------------------------------ the grader's side


class Report:
    """The runner's report, parsed as hostile data (the grader's own checks on every field)."""

    def __init__(self, data: bytes, nonce: str, num_cells: int):
        self.status: dict[int, str] = {}
        self.outputs: dict[int, list] = {}
        self.tests: dict[int, dict] = {}
        self.log: list = []
        self.seconds: dict[int, float] = {}  # cell index -> wall seconds (where the notebook's time went)
        self.complete = False
        self.problems: list[str] = []
        foreign = 0
        prefix = (nonce + " ").encode()
        for line in data.split(b"\n"):
            if not line:
                continue
            if not line.startswith(prefix) or len(line) > MAX_LINE_BYTES:
                foreign += 1
                continue
            try:
                frame = json.loads(line[len(prefix):])
            except (ValueError, RecursionError, UnicodeDecodeError):
                foreign += 1
                continue
            if isinstance(frame, dict):
                self._take(frame, num_cells)
        if foreign:
            self.problems.append(f"{foreign} line(s) of the runner's report could not be read: ignored")

    def _take(self, frame: dict, num_cells: int) -> None:
        if frame.get("done") is True:
            self.complete = True
            status = frame.get("status")
            for k, v in (status.items() if isinstance(status, dict) else ()):
                if str(k).isdigit() and int(k) < num_cells and v in STATUSES:
                    self.status[int(k)] = v
            self.log = frame.get("log") if isinstance(frame.get("log"), list) else []
            seconds = frame.get("seconds")
            for k, v in (seconds.items() if isinstance(seconds, dict) else ()):
                if str(k).isdigit() and int(k) < num_cells and type(v) in (int, float) and 0 <= v < 1e6:
                    self.seconds[int(k)] = round(float(v), 2)
            if type(frame.get("survivors")) is int and frame["survivors"] > 0:
                self.problems.append(f"{frame['survivors']} process(es) the notebook started could not be ended "
                                     "before the runner's report (the sandbox ended them)")
            return
        index = frame.get("cell")
        if type(index) is not int or not 0 <= index < num_cells:
            return
        if frame.get("status") in STATUSES:
            self.status[index] = frame["status"]
        if isinstance(frame.get("outputs"), list):
            self.outputs[index] = [o for o in map(_clean_output, frame["outputs"][:200]) if o is not None]
        if isinstance(frame.get("test"), dict):
            self.tests[index] = frame["test"]


def _text(value, limit: int = 2_000_000) -> str:
    if isinstance(value, list):
        value = "".join(v for v in value[:10_000] if isinstance(v, str))
    return value[:limit] if isinstance(value, str) else ""


def _clean_output(out):
    """An output rebuilt from its known fields only (types checked), or None."""
    import nbformat

    if not isinstance(out, dict) or out.get("output_type") not in OUTPUT_TYPES:
        return None
    kind = out["output_type"]
    if kind == "stream":
        return nbformat.v4.new_output("stream", name="stderr" if out.get("name") == "stderr" else "stdout",
                                      text=_text(out.get("text")))
    if kind == "error":
        tb = out.get("traceback") if isinstance(out.get("traceback"), list) else []
        return nbformat.v4.new_output("error", ename=_text(out.get("ename"), 200), evalue=_text(out.get("evalue"), 100_000),
                                      traceback=[_text(t, 20_000) for t in tb[:50]])
    data = out.get("data") if isinstance(out.get("data"), dict) else {}
    data = {str(k)[:100]: _text(v) for k, v in list(data.items())[:20] if isinstance(k, str)}
    if kind == "execute_result":
        return nbformat.v4.new_output("execute_result", data=data, execution_count=None)
    return nbformat.v4.new_output("display_data", data=data)


WITHHELD = "its message is withheld: the cell ran after a hidden test, so the message could carry hidden inputs"


def rebuild_test_outputs(cell, summary: dict, token: str | None, probe_findings: list[str]) -> list:
    """A hidden-era test cell's outputs, rebuilt by the grader from the runner's summary (in the
    grader's words), for `grade.score_cell` to read as it reads any cell."""
    import nbformat

    from .notebook_cells import grade_id

    outputs = []
    runner_error = summary.get("runner_error")
    if isinstance(runner_error, dict) and runner_error.get("ename") in RUNNER_ERRORS:
        outputs.append(nbformat.v4.new_output("error", ename=runner_error["ename"],
                                              evalue=_text(runner_error.get("evalue"), 300), traceback=[]))
    error = summary.get("error")
    if error in KERNEL_ERRORS + ("Error",):
        if summary.get("integrity") is True:
            found = list(probe_findings)
            if summary.get("integrity_more") is True or not found:
                found.append("the guard found changes after a hidden test had run (what they were is not shown: "
                             "code run after a hidden test could write hidden inputs into it)")
            evalue = (INTEGRITY + "; ".join(found)
                      + ". The grader restored the original code; no credit for this notebook's graded cells.")
        else:
            messages = visible_assert_messages(_original(cell))
            number = summary.get("message")
            evalue = messages[number] if type(number) is int and 0 <= number < len(messages) else (
                "" if error == "NotImplementedError" else f"({WITHHELD})")
            if summary.get("refusal") in REFUSALS and error == "AssertionError":
                evalue = (f"your code {REFUSALS[summary['refusal']]} (what it calls is not shown: the cell ran after a "
                          "hidden test)")
        outputs.insert(0, nbformat.v4.new_output("error", ename=error, evalue=evalue, traceback=[]))
    if summary.get("stderr") is True:
        outputs.append(nbformat.v4.new_output("stream", name="stderr", text=f"({WITHHELD})\n"))
    if summary.get("marker") is True and token is not None:
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=f"[autograder] {grade_id(cell)} ok {token}\n"))
    return outputs


def add_integrity_probe(nb, guard_name: str | None) -> int | None:
    """Insert the runner's probe cell before the first hidden test (where the guard reports what it
    has found so far, while nothing hidden has reached the kernel). Returns its index, or None."""
    import nbformat

    index = first_hidden_cell(nb)
    if guard_name is None or index >= len(nb.cells):
        return None
    probe = nbformat.v4.new_code_cell(f"{guard_name}('')  # [autograder] integrity probe: before any hidden test")
    probe.metadata["autograder"] = {PROBE_META: True, "origin": "grader"}
    nb.cells.insert(index, probe)
    return index


def merge(nb, report: Report, tokens: dict, probe: int | None) -> dict[int, str]:
    """Put the report's outputs into the grader's copy of the notebook (whole before the first
    hidden test, rebuilt summaries of test cells after it, nothing else), take the probe cell out
    again, and return the cells' statuses by their index without it."""
    from .notebook_cells import grade_id, is_test_cell

    before = first_hidden_cell(nb)
    probe_findings = [] if probe is None else [
        f for o in report.outputs.get(probe, []) if o.get("output_type") == "error" for f in findings(o.get("evalue", ""))]
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        if index < before:
            cell["outputs"] = report.outputs.get(index, [])
        elif is_test_cell(cell) and index in report.tests:
            cell["outputs"] = rebuild_test_outputs(cell, report.tests[index], tokens.get(grade_id(cell)), probe_findings)
        else:
            cell["outputs"] = []
    status = dict(report.status)
    if probe is not None:
        del nb.cells[probe]
        status = {(i - 1 if i > probe else i): s for i, s in status.items() if i != probe}
    return status
