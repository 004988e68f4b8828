"""`python -m autograder grade NOTEBOOK... --json PATH`: grade submissions without nbgrader's database.

For each submitted notebook (docs/grading.md has the whole story):

1. **Find its source** in `--source-dir` (the instructor's nbgrader source, e.g. `solutions/`).
2. **Restore** what the student may not change (nbgrader's autograde semantics, keyed by
   `metadata.nbgrader.grade_id`): graded test cells and read-only cells from the source, hidden
   tests included; deleted ones put back; points and metadata always from the source.
3. **Scan** the student's code (`scan_source`: evidence that zeroes the notebook) and fingerprint
   it (`autograder.fingerprint`: copies, flagged for review).
4. **Execute** in a sandbox of its own (`autograder.sandbox`, `autograder.sandbox_exec`): a fresh
   kernel, cell by cell, per-cell timeout, a time budget, restarts after a kernel dies, outputs
   capped; the in-kernel guard (`autograder.integrity`) wraps every test cell, and every check
   call is recorded as plain data (`autograder.record`).
5. **Decide in the grader**: each test cell's checks are replayed from the record in this process
   (`autograder.verdict`, `autograder.replay`); a cell earns its points only if it passed in the
   kernel (nbgrader's rule plus the guard's marker) AND every check passes in replay.

Writes `{"score", "max_score", "notebooks": [{"path", "score", "max_score", "cells": [...]}]}`;
each cell has `cell_id`, `grade_id`, `score`, `max_score`, `passed`, `status`, `feedback`.
Many submissions: `autograder.batch` (workers, one JSON each, summary.csv, resume).

One module per stage: `notebook_cells` (cell metadata, hidden-test blocks), `source_notebook` (find the
source, restore), `scan`, `guard_cells`, `sandbox_run` (limits, staging, the run), `executor` (the
runner inside the sandbox), `scoring`, `pipeline` (one notebook through them all), `feedback_html`;
this module is the command, and keeps every name code and tests import from `autograder.grade`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .executor import DEFAULT_TIMEOUT, MAX_KERNEL_RESTARTS, PROBE_TIMEOUT, SETUP_TIMEOUT  # noqa: F401
from .executor import _error_output, _Executor, _kernel_env  # noqa: F401
from .feedback_html import _ansi_free, render_html  # noqa: F401
from .guard_cells import _strip_guard, inject_guard  # noqa: F401
from .notebook_cells import (HIDDEN_BEGIN, HIDDEN_END, _nbg, _visible, grade_id, hidden_line_ranges,  # noqa: F401
                             hidden_lines, is_manual_cell, is_protected, is_test_cell, points, without_hidden)
from .pipeline import grade_notebook  # noqa: F401
from .sandbox_run import (DEFAULT_BUDGET, GUARDED_PACKAGES, MAX_DATA_BYTES, MAX_NOTEBOOK_BYTES, ROOT,  # noqa: F401
                          GradingRefused, NoSandbox, Stage, _copy_data_files, _open_no_follow, read_submission,
                          run_in_sandbox, runner_log, unneeded_from)
from .scan import review_flags, scan_source  # noqa: F401
from .scoring import _cell_entry, _empty_entry, _kernel_feedback, score_cell  # noqa: F401
from .source_notebook import _read, answer_ids, assemble, find_source, source_index, source_lookup, source_mismatch  # noqa: F401,E501


def grade(paths, *, source_dir="solutions", timeout=DEFAULT_TIMEOUT, html_dir=None, kernel_name="python3",
          jobs=1, guard=True, sandbox: bool | None = None, budget_s: float = DEFAULT_BUDGET,
          max_bytes: int = MAX_NOTEBOOK_BYTES, out_dir=None, roots=(), progress=False) -> dict:
    """Grade every notebook in `paths` (worker processes, one sandbox each); one failing notebook
    never stops the others. See autograder.batch for `out_dir` (one JSON each, summary.csv, resume)."""
    from . import sandbox as sb
    from .batch import run_batch

    if sandbox is None or sandbox:
        why = sb.available()
        if why is not None:
            raise NoSandbox(why)
        sandbox = True
    return run_batch(paths, roots=list(roots), source_dir=source_dir, timeout=timeout, html_dir=html_dir,
                     kernel_name=kernel_name, jobs=jobs, guard=guard, sandbox=sandbox, budget_s=budget_s,
                     max_bytes=max_bytes, out_dir=out_dir, progress=progress)


def main(args) -> int:
    from . import sandbox as sb
    from .batch import find_notebooks, terminal_safe

    paths = []
    for p in args.notebooks:
        p = Path(p)
        # symbolic links below a folder are listed, not followed: the batch refuses them by name
        paths += find_notebooks(p) if p.is_dir() else [p]
    if not paths:
        print("no notebooks to grade")
        return 2
    why = sb.available()
    if why is not None and not args.unsafe:
        print(NoSandbox(why), file=sys.stderr)
        return 3
    result = grade(paths, source_dir=args.source_dir, timeout=args.timeout, html_dir=args.html,
                   kernel_name=args.kernel, jobs=args.jobs, sandbox=not args.unsafe and why is None,
                   budget_s=args.budget, max_bytes=int(args.max_notebook_mb * (1 << 20)), out_dir=args.out,
                   roots=[Path(p) for p in args.notebooks], progress=not args.quiet)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not args.quiet or len(result["notebooks"]) <= 20:
        for nb in result["notebooks"]:
            flag = (" INTEGRITY" if nb["integrity"] else "") + (f" FLAGGED({len(nb['flags'])})" if nb.get("flags") else "")
            errors = f" ({len(nb['errors'])} problem(s): {nb['errors'][0]})" if nb["errors"] else ""
            print(f"{nb['score']:6g} / {nb['max_score']:<6g} {terminal_safe(nb['path'] + flag + errors)}")
    print(f"{result['score']:6g} / {result['max_score']:<6g} total -> {args.json}")
    return 0
