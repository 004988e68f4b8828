"""What comes back from a sandbox is the runner's report alone (issue 23, deliverable 4), read as
hostile data: lines without the run's nonce are not the runner's; no output of a cell from the
first hidden test on comes back, only a test cell's summary in the grader's words; a cell's
outputs are what it printed while it ran. Kernel-free: the report is built by the runner's own
code (Reporter) from a notebook executed by hand."""
from __future__ import annotations

import json

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import grade as G
from autograder import runner_report as R
from autograder.sandbox_exec import cap_outputs

NONCE = "0123456789abcdef"
TEST = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False, "locked": True}}
VISIBLE = 'assert f(2) == 4, "f(2) should be 4"\ncheck_f(f)\n'
HIDDEN = "### BEGIN HIDDEN TESTS\nassert f(5) == 10, \"hidden: f(5) is 10\"\ncheck_f(f, seed=7)\n### END HIDDEN TESTS"


class _Ran:
    """What _Executor holds after running (statuses, the errors it added)."""

    def __init__(self, status):
        self.status, self.runner_errors, self.log, self.restarts = status, {}, [], 0
        self.timings = {str(k): 0.5 for k in status}  # (cell index -> seconds, as _Executor keeps them)


def _prepared():
    """A notebook as the grader sends it: setup, a student cell, the test cell (guarded), a later cell."""
    nb = new_notebook(cells=[new_code_cell("def f(x):\n    return 2 * x"), new_code_cell(VISIBLE + HIDDEN, metadata=TEST),
                             new_code_cell("print('after')")])
    tokens = G.inject_guard(nb, "__guard__")
    probe = R.add_integrity_probe(nb, "__guard__")
    return nb, tokens, probe


def _run(nb, outputs: dict, status: dict, nonce=NONCE) -> bytes:
    lines = []
    reporter = R.Reporter(lambda data: lines.append(data), nonce, nb, R.first_hidden_cell(nb), cap_outputs)
    ran = _Ran(status)
    for index, outs in outputs.items():
        nb.cells[index]["outputs"] = outs
        reporter.cell_done(ran, index)
    reporter.finish(ran, 0)
    return b"".join(lines)


def test_the_probe_goes_just_before_the_first_hidden_test_and_only_earlier_outputs_come_back():
    nb, tokens, probe = _prepared()
    test = R.first_hidden_cell(nb)
    assert probe == test - 1 and nb.cells[probe].source.startswith("__guard__('')")
    leak = new_output("stream", name="stdout", text="HIDDEN INPUTS 5, 10\n")
    marker = new_output("stream", name="stdout", text=f"[autograder] t ok {tokens['t']}\n")
    data = _run(nb, {0: [], 1: [new_output("stream", name="stdout", text="early\n")], probe: [],
                     test: [leak, marker], test + 1: [leak]},
                {0: "ok", 1: "ok", probe: "ok", test: "ok", test + 1: "ok"})
    assert b"HIDDEN INPUTS" not in data and tokens["t"].encode() not in data, "nothing of those cells is sent"
    report = R.Report(data, NONCE, len(nb.cells))
    status = R.merge(nb, report, tokens, probe)
    assert len(nb.cells) == 4 and status == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}, "the probe is gone"
    assert nb.cells[1].outputs[0]["text"] == "early\n" and nb.cells[3].outputs == []
    assert G.score_cell(nb.cells[2], status[2], tokens["t"])[:2] == (1.0, "passed"), "the marker is vouched for"


def test_a_hidden_era_error_comes_back_as_a_kind_and_a_visible_constant_at_most():
    nb, tokens, probe = _prepared()
    test = R.first_hidden_cell(nb)
    cases = {"f(2) should be 4": "AssertionError: f(2) should be 4",
             "hidden: f(5) is 10": "AssertionError: (" + R.WITHHELD + ")",
             "got [5, 10] from the hidden seed": "AssertionError: (" + R.WITHHELD + ")"}
    for evalue, shown in cases.items():
        nb, tokens, probe = _prepared()
        error = new_output("error", ename="AssertionError", evalue=evalue, traceback=["Cell In[3], line 2"])
        data = _run(nb, {test: [error, new_output("stream", name="stderr", text="5 10\n")]}, {test: "error"})
        assert evalue.encode() not in data, "(a visible constant comes back as its number)"
        status = R.merge(nb, R.Report(data, NONCE, len(nb.cells)), tokens, probe)
        score, state, feedback = G.score_cell(nb.cells[2], status[2], tokens["t"])
        assert (score, state, feedback) == (0.0, "failed", shown)
    nb, tokens, probe = _prepared()
    error = new_output("error", ename="AssertionError", traceback=[],
                       evalue="slot_mapping uses course_lib's reference implementation instead of your own (it calls x.y5_10)")
    data = _run(nb, {test: [error]}, {test: "error"})
    assert b"y5_10" not in data
    status = R.merge(nb, R.Report(data, NONCE, len(nb.cells)), tokens, probe)
    assert "uses course_lib's reference implementation instead of your own (what it calls is not shown" in \
        G.score_cell(nb.cells[2], status[2], tokens["t"])[2]
    nb, tokens, probe = _prepared()
    error = new_output("error", ename="ValueError", evalue="secret 5 10", traceback=[])
    data = _run(nb, {test: [error]}, {test: "error"})
    status = R.merge(nb, R.Report(data, NONCE, len(nb.cells)), tokens, probe)
    assert G.score_cell(nb.cells[2], status[2], tokens["t"])[2] == "Error: (" + R.WITHHELD + ")"


def test_integrity_findings_come_from_the_probe_before_any_hidden_test():
    nb, tokens, probe = _prepared()
    test = R.first_hidden_cell(nb)
    before = new_output("error", ename="AssertionError", traceback=[],
                        evalue="integrity violation: autograder.checks.x.check_f was replaced. The grader restored ...")
    after = new_output("error", ename="AssertionError", traceback=[],
                       evalue="integrity violation: autograder.checks.x.check_f was replaced; Foo.secret_5_10 was "
                              "added. The grader restored ...")
    data = _run(nb, {probe: [before], test: [after]}, {probe: "error", test: "error"})
    assert b"secret_5_10" not in data
    status = R.merge(nb, R.Report(data, NONCE, len(nb.cells)), tokens, probe)
    _, state, feedback = G.score_cell(nb.cells[2], status[2], tokens["t"])
    assert state == "integrity" and "check_f was replaced" in feedback and "after a hidden test had run" in feedback


def test_lines_without_the_nonce_or_out_of_shape_are_not_the_runner_s():
    nb, tokens, probe = _prepared()
    forged = json.dumps({"cell": 1, "status": "ok", "outputs": [{"output_type": "stream", "name": "stdout",
                                                                  "text": "FORGED"}]}).encode()
    data = (b"deadbeef " + forged + b"\n" + NONCE.encode() + b" {not json\n"
            + NONCE.encode() + b" " + json.dumps({"cell": 99, "status": "ok"}).encode() + b"\n"
            + NONCE.encode() + b" " + json.dumps({"cell": 1, "status": "pwned", "outputs": [
                {"output_type": "display_data", "data": {"text/html": "<script>", "x": ["a", 1]}, "metadata": {"m": 1}},
                {"output_type": "weird"}]}).encode() + b"\n" + NONCE.encode() + b" " + b"[" * 100_000 + b"\n")
    report = R.Report(data, NONCE, len(nb.cells))
    assert report.problems == ["3 line(s) of the runner's report could not be read: ignored"]
    assert report.status == {} and not report.complete
    assert report.outputs[1] == [nbformat.v4.new_output("display_data", data={"text/html": "<script>", "x": "a"})]


def test_cell_seconds_come_back_as_numbers_for_known_cells_only():
    nb, tokens, probe = _prepared()
    data = _run(nb, {0: []}, {0: "ok", 1: "ok"})
    assert R.Report(data, NONCE, len(nb.cells)).seconds == {0: 0.5, 1: 0.5}
    forged = {"done": True, "status": {}, "seconds": {"0": 1.25, "1": -1, "2": "9", "3": float("nan"),
                                                      "4": 1e300, "99": 1.0, "x": 2.0, "5": True}}
    report = R.Report(NONCE.encode() + b" " + json.dumps(forged).encode() + b"\n", NONCE, len(nb.cells))
    assert report.seconds == {0: 1.25}, "negative, text, NaN, huge, unknown cells and booleans are dropped"


def test_a_cell_s_outputs_are_not_rewritten_by_a_later_display_update():
    """nbclient would update every earlier output with the same display_id: the executor does not."""
    from autograder.grade import _Executor

    nb = new_notebook(cells=[new_code_cell("x")])
    executor = _Executor(nb, "/tmp", "python3", 10)
    nb.cells[0].outputs = [new_output("display_data", data={"text/plain": "before"})]
    executor.client._display_id_map = {"d": {0: [0]}}
    msg = {"header": {"msg_type": "update_display_data"},
           "content": {"data": {"text/plain": "HIDDEN"}, "metadata": {}, "transient": {"display_id": "d"}}}
    executor.client._update_display_id("d", msg)
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "before"


def test_outputs_over_the_report_s_budget_are_dropped_and_the_statuses_still_come(monkeypatch):
    monkeypatch.setattr(R, "OUTPUTS_BUDGET", 1000)
    nb, tokens, probe = _prepared()
    big = new_output("stream", name="stdout", text="x" * 5000)
    data = _run(nb, {0: [], 1: [big]}, {0: "ok", 1: "ok", 4: "ok"})
    report = R.Report(data, NONCE, len(nb.cells))
    assert "outputs dropped" in report.outputs[1][0]["text"] and report.complete and report.status[4] == "ok"
