"""One notebook through every stage: source, restore, scan, run in the sandbox, replay, score, flags.
(Many notebooks: `autograder.batch`; the command: `autograder.grade`.)"""
from __future__ import annotations

import secrets
import time
from pathlib import Path

from .executor import DEFAULT_TIMEOUT
from .guard_cells import _strip_guard
from .notebook_cells import (_nbg, _visible, grade_id, hidden_line_ranges, hidden_lines, is_manual_cell, is_test_cell,
                             normalised, points)
from .sandbox_run import DEFAULT_BUDGET, MAX_NOTEBOOK_BYTES, GradingRefused, NoSandbox, read_submission, run_in_sandbox
from .scan import review_flags, scan_source
from .scoring import _cell_entry, _empty_entry, _kernel_feedback, score_cell
from .source_notebook import _read, assemble


def grade_notebook(path, source_path, *, timeout=DEFAULT_TIMEOUT, kernel_name="python3", guard=True,
                   sandbox: bool | None = None, budget_s: float = DEFAULT_BUDGET,
                   max_bytes: int = MAX_NOTEBOOK_BYTES) -> tuple[dict, object]:
    """Grade one submission against its source. Returns (result entry, executed notebook).
    `sandbox`: True (bwrap, required), False (unsafe: a plain subprocess), None: bwrap if available."""
    from . import fingerprint
    from .counterpart_refs import counterpart_references
    from . import sandbox as sb
    from .hidden_seeds import hide_in, keyed_source
    from .verdict import Redactor, cell_plan, cell_verdict, replay_budget, replay_plan

    started = time.monotonic()
    entry = _empty_entry(path, source_path)
    if source_path is None:
        entry["errors"].append("no source notebook found for this submission (see --source-dir)")
        return entry, None
    source = keyed_source(_read(Path(source_path)))  # (hidden seeds derived from --seed-key, if given)
    tests = [c for c in source.cells if is_test_cell(c)]
    entry["max_score"] = sum(points(c) for c in tests)
    try:
        submission = read_submission(Path(path), max_bytes)
    except Exception as exc:  # noqa: BLE001 - too large, unreadable, not JSON, wrong format
        why = str(exc) if isinstance(exc, GradingRefused) else f"could not read the notebook: {type(exc).__name__}: {exc}"
        entry["errors"].append(why[:1000])
        entry["cells"] = [_cell_entry(c, 0.0, "not_run", why[:1000]) for c in tests]
        return entry, None
    if sandbox is None or sandbox:
        if sb.available() is not None:
            raise NoSandbox(sb.available())
        sandbox = True
    entry["sandbox"] = "bwrap" if sandbox else "none (--unsafe)"
    nb, entry["notes"] = assemble(submission, source)
    hidden = [line for c in source.cells if c.get("cell_type") == "code" for line in hidden_lines(c.get("source", ""))]
    redact = Redactor(hidden)
    # The student's code is scanned (evidence); code cells exactly as the instructor wrote them (or as the
    # release shows them) are not. The student's side is compared whole: a "hidden tests" block a student
    # writes into a copy of an instructor cell is code of theirs, and is scanned.
    instructor = {form(c.get("source", "")) for c in source.cells
                  if c.get("cell_type") == "code" and not _nbg(c).get("solution") for form in (_visible, normalised)}
    # What the released notebook gives (scaffolding: never the student's copy, nor a review flag).
    given = fingerprint.given_by(source)
    given_review = {f.split(": ", 1)[-1] for text in given.cells for f in review_flags(text)}
    student_cells = []
    for index, cell in enumerate(nb.cells):
        if (cell.get("cell_type") == "code" and cell["metadata"].get("autograder", {}).get("origin") == "submission"
                and normalised(cell.get("source", "")) not in instructor):
            entry["integrity"] += [f"cell {index}, {f}" for f in scan_source(cell.get("source", ""))]
            entry["flags"] += [f"cell {index}, {f}" for f in review_flags(cell.get("source", ""))
                               if f.split(": ", 1)[-1] not in given_review]
            student_cells.append((index, cell.get("source", "")))
    copies = fingerprint.source_copies(student_cells, given)
    entry["flags"] += counterpart_references(student_cells, "\n".join(given.cells))
    plans = {grade_id(c): cell_plan(c.get("source", ""), hidden_line_ranges(c.get("source", ""))) for c in nb.cells
             if is_test_cell(c)}
    guard_name = f"__autograder_{secrets.token_hex(6)}__" if guard else None
    timings = entry["timings"] = {"prepare_s": round(time.monotonic() - started, 2)}  # where the time goes
    mark = time.monotonic()
    nb, status, log, records, problems, tokens, changed, cell_seconds = run_in_sandbox(
        nb, Path(path), timeout=timeout, kernel_name=kernel_name, budget_s=budget_s, sandbox=sandbox,
        tokens_guard=guard_name)
    entry["errors"] += log + problems
    entry["integrity"] += [f"changed {f} on disk" for f in changed]
    setup = nb.cells[0] if guard and nb.cells else None
    if setup is not None and status.get(0) != "ok":
        why = next((f"{o.get('ename')}: {o.get('evalue')}" for o in setup.get("outputs", [])
                    if o.get("output_type") == "error"), status.get(0))
        entry["errors"].append(f"the grader's setup cell failed ({why}): the graded cells could not be checked")
    timings["sandbox_s"], mark = round(time.monotonic() - mark, 2), time.monotonic()
    timings["cells_s"] = {str(k): v for k, v in sorted(cell_seconds.items())}  # the runner's clock, per cell
    skipped = sum(1 for v in status.values() if v == "skipped")
    if skipped:
        entry["notes"].append(f"{skipped} code cell(s) after the last graded test were not run: no score depends on "
                              "them and none of their output would come back")
    verdict = replay_plan(plans, records, budget_s=replay_budget(budget_s, time.monotonic() - started))
    timings["replay_s"], mark = round(time.monotonic() - mark, 2), time.monotonic()
    results, records = verdict.results, verdict.entries  # records: each line's evidence, from the replay's process
    entry["errors"] += verdict.problems
    entry["flags"] += verdict.flags
    entry["replay"] = [{"exercise": ex, "seed": seed, "passed": ok,
                        "message": redact(msg) if not any(p.hidden for ps in plans.values() for p in ps
                                                          if (p.exercise, p.seed) == (ex, seed)) else
                        ("" if ok else "hidden test: message withheld")}
                       for (ex, seed), (ok, msg) in sorted(results.items())]
    copies += fingerprint.code_copies(records, student_cells, given)
    entry["flags"] += [c.flag for c in copies]
    entry["copies"] = [c.evidence() for c in copies]  # each with both pieces of code, side by side
    for rec in records:
        calls = rec.get("thread_reference_calls")
        if isinstance(calls, list) and calls:
            entry["flags"].append(f"check_{rec['exercise']}(seed={rec['seed']}): course_lib's counterpart was called "
                                  f"while the check ran ({', '.join(map(str, calls[:3]))})")
    for index, cell in enumerate(nb.cells):
        if is_test_cell(cell):
            gid = grade_id(cell)
            score, state, feedback = score_cell(cell, status.get(index), tokens.get(gid))
            if state == "integrity" and feedback.startswith("AssertionError: integrity violation: "):
                found = feedback.removeprefix("AssertionError: integrity violation: ").split(". The grader restored")[0]
                entry["integrity"] += found.split("; ")
            plan = plans.get(gid, [])
            if plan:
                ok, why = cell_verdict(plan, results)
                if not ok:
                    score, state, feedback = 0.0, "failed", why
                elif state != "passed" and hidden_line_ranges(cell.get("source", "")) and state == "failed":
                    feedback = _kernel_feedback(cell, feedback)
            elif state in ("passed", "partial"):
                entry["notes"].append(f"{gid}: no check call to replay, so its result was decided in the kernel")
            entry["cells"].append(_cell_entry(cell, score, state, redact(feedback)))
        elif is_manual_cell(cell):
            entry["manual_cells"].append({"grade_id": grade_id(cell), "max_score": points(cell)})
    if entry["integrity"]:
        entry["integrity"] = [redact(x) for x in dict.fromkeys(entry["integrity"])]
        reason = ("integrity violation: " + "; ".join(entry["integrity"])[:1500]
                  + ". No credit for this notebook's graded cells (docs/grading.md explains what is checked).")
        for c in entry["cells"]:
            c["check_feedback"] = c["feedback"]
            c.update(score=0.0, passed=False, status="integrity", feedback=reason, message=reason)
    entry["flags"] = [redact(f) for f in dict.fromkeys(entry["flags"])]
    entry["copies"] = [{k: redact(v) for k, v in c.items()} for c in entry.get("copies", [])]
    entry["errors"] = [redact(e) for e in entry["errors"]]
    _strip_guard(nb, tokens)
    nb.cells = [c for c in nb.cells if not c.get("metadata", {}).get("autograder", {}).get("setup")]
    entry["score"] = sum(c["score"] for c in entry["cells"])
    entry["max_score"] = sum(c["max_score"] for c in entry["cells"]) or entry["max_score"]
    timings["evidence_s"] = round(time.monotonic() - mark, 2)
    entry["duration_s"] = round(time.monotonic() - started, 1)
    nb.metadata["autograder"] = {"hidden_lines": hidden}
    shown = {p.seed for ps in plans.values() for p in ps if not p.hidden}
    entry = hide_in(entry, {p.seed for ps in plans.values() for p in ps if p.hidden} - shown)  # (no hidden seed shown)
    return entry, nb
