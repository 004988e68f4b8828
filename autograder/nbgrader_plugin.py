"""The integrity guard inside `nbgrader autograde` (wired in by autograder/nbgrader_config.py).

`InjectGuard` runs just before nbgrader's `Execute`: it adds the grader's setup cell and wraps
every graded test cell exactly like `python -m autograder grade` does (see
`autograder.integrity`). `VerifyGuard` runs just after: a test cell without its completion
marker gets an error output (so nbgrader's `SaveAutoGrades` gives it 0); if the guard reported an
integrity violation anywhere, every graded test cell of the notebook gets one; then the cells get
their own source back and the setup cell is removed, so the feedback shows the notebook as the
student wrote it.

What nbgrader's flow does NOT give you (use `python -m autograder grade` for those): a sandbox per
submission (nbgrader runs the student's code in the grader's own account), the verdict decided in
the grader's process by replaying the sandbox's record (here the in-kernel guard is all there is),
copy flags, the scan of the student's code, time budgets and output caps, and recovery from a
kernel that dies mid-notebook. Use nbgrader's flow for your own notebooks (and the demo).
"""
from __future__ import annotations

import secrets

from nbconvert.preprocessors import Preprocessor
from nbformat.v4 import new_output

from .guard_cells import _strip_guard, inject_guard
from .notebook_cells import grade_id, is_test_cell

_TOKENS_KEY = "autograder_guard_tokens"


class InjectGuard(Preprocessor):
    def preprocess(self, nb, resources):
        tokens = inject_guard(nb, f"__autograder_{secrets.token_hex(6)}__")
        resources[_TOKENS_KEY] = tokens
        return nb, resources


class VerifyGuard(Preprocessor):
    def preprocess(self, nb, resources):
        tokens = resources.pop(_TOKENS_KEY, {})
        violation = None
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and str(out.get("evalue", "")).startswith("integrity violation"):
                    violation = violation or out["evalue"]
        for cell in nb.cells:
            if not is_test_cell(cell):
                continue
            gid = grade_id(cell)
            text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            has_error = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
            if violation and not has_error:
                cell.outputs.append(new_output("error", ename="IntegrityError", evalue=violation,
                                               traceback=[f"IntegrityError: {violation}"]))
            elif not has_error and gid in tokens and f"[autograder] {gid} ok {tokens[gid]}" not in text:
                message = "the grader's completion marker is missing: the cell did not run to its end under the guard"
                cell.outputs.append(new_output("error", ename="IntegrityError", evalue=message,
                                               traceback=[f"IntegrityError: {message}"]))
        _strip_guard(nb, tokens)
        nb.cells = [c for c in nb.cells if not c.get("metadata", {}).get("autograder", {}).get("setup")]
        for cell in nb.cells:
            cell.get("metadata", {}).pop("autograder", None)
        return nb, resources
