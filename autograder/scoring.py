"""A test cell's score from what the kernel did (nbgrader's rule: no error, nothing on stderr, a
numeric result is partial credit, plus the guard's completion marker), and the JSON entries of cells
and notebooks."""
from __future__ import annotations

import re

from .feedback_html import _ansi_free
from .notebook_cells import grade_id, hidden_line_ranges, points


def _feedback_of_error(out) -> str:
    ename, evalue = out.get("ename", "Error"), str(out.get("evalue", "")).strip()
    if ename in ("AssertionError", "NotImplementedError", "CellTimeoutError", "DeadKernelError") or not evalue:
        text = f"{ename}: {evalue}" if evalue else ename
        if ename == "NotImplementedError":
            text = "NotImplementedError: this exercise is not finished yet" + (f" ({evalue})" if evalue else "")
    else:
        text = f"{ename}: {evalue.splitlines()[-1] if evalue else ''}"
    return text[:2000]


def _partial(out, max_points):
    """nbgrader: a numeric last expression is partial credit."""
    text = out.get("data", {}).get("text/plain")
    if text is None:
        return None
    try:
        value = float(text if isinstance(text, str) else "".join(text))
    except ValueError:
        return None
    return max(0.0, min(value, max_points))


def score_cell(cell, status: str | None, token: str | None) -> tuple[float, str, str]:
    """(score, status, feedback) of one graded test cell."""
    max_points = points(cell)
    outputs = cell.get("outputs", [])
    if status in (None, "not_run"):
        return 0.0, "not_run", "not run: the kernel kept dying before this cell, so grading stopped"
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if status in ("timeout", "crashed"):
        return 0.0, status, _feedback_of_error(errors[-1]) if errors else status
    if errors:
        feedback = _feedback_of_error(errors[0])
        return 0.0, "integrity" if feedback.startswith("AssertionError: integrity violation") else "failed", feedback
    stderr = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr.strip():
        return 0.0, "failed", ("the cell wrote to stderr, which nbgrader counts as a failure: "
                               + stderr.strip().splitlines()[-1][:500])
    stdout = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    if token is not None and f"[autograder] {grade_id(cell)} ok {token}" not in stdout:
        return 0.0, "integrity", ("integrity: the grader's completion marker is missing, so the cell did not run to its "
                                  "end under the grader's guard")
    for out in outputs:
        if out.get("output_type") == "execute_result":
            partial = _partial(out, max_points)
            if partial is not None:
                return partial, "passed" if partial >= max_points else "partial", f"partial credit: {partial:g}"
    return max_points, "passed", ""


def _empty_entry(path, source_path) -> dict:
    return {"path": str(path), "source": str(source_path) if source_path else None, "score": 0.0,
            "max_score": 0.0, "cells": [], "manual_cells": [], "integrity": [], "flags": [], "copies": [],
            "notes": [], "errors": [], "replay": []}


def _kernel_feedback(cell, feedback: str) -> str:
    """A test cell that failed in the kernel: its message, unless it was raised in the hidden part."""
    ranges = hidden_line_ranges(cell.get("metadata", {}).get("autograder", {}).get("original_source", "")
                                or cell.get("source", ""))
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        for frame in out.get("traceback", [])[:3]:
            m = re.search(r"(?:Cell In\[\d*\]|Input In \[\d*\]), line (\d+)", _ansi_free(str(frame)))
            if m:
                line = int(m.group(1)) - 1  # the guard's line comes first
                if any(first <= line <= last for first, last in ranges):
                    return "a hidden test failed in your notebook; its message is withheld (it would show the hidden test)"
                return feedback
    return feedback


def _cell_entry(cell, score, status, feedback):
    gid = grade_id(cell)
    return {"cell_id": gid, "grade_id": gid, "score": float(score), "max_score": points(cell),
            "passed": status == "passed", "status": status, "feedback": feedback, "message": feedback}
