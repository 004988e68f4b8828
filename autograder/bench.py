"""`python -m course_lib bench grading` (or `python -m autograder bench`): how long grading takes, and where.

Grades the perfect submission of every course notebook (the solutions handed in through the
released notebooks, as the round trip does) with `python -m autograder grade`'s own code, as a
batch with `--jobs N`, and prints per notebook the grader's `duration_s` and its phases
(`entry["timings"]`: restore and scan, the sandbox run, the replay, the evidence and scoring), then the
median, the batch's wall time per notebook, and what a course of 1,600 notebooks would take at
that rate. The load average is printed with it: on a shared machine it moves every number.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# grade_notebook's own clock: restore + scan + source fingerprints; the sandbox (runner and kernel
# start, every cell, the record written); the replay in its child; copy evidence, scoring, feedback.
PHASES = ("prepare_s", "sandbox_s", "replay_s", "evidence_s")
SLOW_CELLS = 4  # per notebook, in the report: where the sandbox's time went


def _submissions(base: Path, notebooks: list[str], copies: int, source_dir: Path) -> list[Path]:
    import nbformat

    from .submissions import perfect_submission, released_submission

    paths = []
    for name in notebooks:
        source = nbformat.read(source_dir / name / f"{name}.ipynb", as_version=4)
        nb = perfect_submission(source, released_submission(source))
        for copy in range(copies):
            path = base / "submitted" / f"student{copy:03d}" / name / f"{name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
            paths.append(path)
    return paths


def _course_notebooks(source_dir: Path) -> list[str]:
    from .exercises import EXERCISES

    return sorted({e.assignment for e in EXERCISES if (source_dir / e.assignment).is_dir()})


def run(notebooks: list[str] | None = None, copies: int = 1, jobs: int = 2, source_dir: Path | None = None) -> dict:
    from .grade import grade

    source_dir = Path(source_dir or ROOT / "solutions")
    notebooks = notebooks or _course_notebooks(source_dir)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        base = Path(tmp)
        paths = _submissions(base, notebooks, copies, source_dir)
        load_before = os.getloadavg()[0]
        began = time.monotonic()
        result = grade(paths, source_dir=source_dir, jobs=jobs, out_dir=base / "results",
                       roots=[base / "submitted"], progress=True)
        wall = time.monotonic() - began
        load_after = os.getloadavg()[0]
    rows = [{"notebook": e.get("notebook", e["path"]), "score": e["score"], "max_score": e["max_score"],
             "duration_s": e.get("duration_s"), "timings": e.get("timings", {}), "errors": e.get("errors", []),
             "failed": [c["grade_id"] for c in e.get("cells", []) if c.get("score") != c.get("max_score")]}
            for e in result["notebooks"]]
    durations = [r["duration_s"] for r in rows if isinstance(r["duration_s"], (int, float))]
    per_notebook = wall / max(1, len(rows))
    return {"jobs": jobs, "notebooks": len(rows), "wall_s": round(wall, 1),
            "wall_per_notebook_s": round(per_notebook, 2),
            "median_duration_s": round(statistics.median(durations), 1) if durations else None,
            "course_of_1600_h": round(1600 * per_notebook / 3600, 2),
            "load_average": [round(load_before, 2), round(load_after, 2)], "rows": rows,
            "full_marks": all(r["score"] == r["max_score"] for r in rows)}


def report(summary: dict) -> str:
    head = ["notebook", "score", "total"] + [p.removesuffix("_s") for p in PHASES]
    lines = ["  ".join(f"{h:>10}" if i else f"{h:<34}" for i, h in enumerate(head))]
    for r in summary["rows"]:
        cells = [f"{r['notebook'][:34]:<34}", f"{r['score']:g}/{r['max_score']:g}".rjust(10),
                 f"{r['duration_s']}".rjust(10)]
        cells += [f"{r['timings'].get(p, '')}".rjust(10) for p in PHASES]
        lines.append("  ".join(cells))
        lines += [f"    problem: {e}" for e in r["errors"][:3]]
        lines += [f"    not full marks: {', '.join(r['failed'])}"] if r["failed"] else []
        slow = sorted(r["timings"].get("cells_s", {}).items(), key=lambda kv: -kv[1])[:SLOW_CELLS]
        lines += [f"    slowest cells: {', '.join(f'{i}: {s:g} s' for i, s in slow)}"] if slow else []
    lines.append(
        f"\n{summary['notebooks']} notebooks with --jobs {summary['jobs']}: {summary['wall_s']} s wall, "
        f"{summary['wall_per_notebook_s']} s per notebook; median duration_s {summary['median_duration_s']} s; "
        f"a course of 1,600 notebooks: {summary['course_of_1600_h']} h at this rate "
        f"(load average {summary['load_average'][0]} before, {summary['load_average'][1]} after; "
        f"every submission full marks: {summary['full_marks']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib bench grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebooks", nargs="*", default=None, help="assignments (default: every graded one)")
    parser.add_argument("--copies", type=int, default=1, help="submissions per notebook (default: 1)")
    parser.add_argument("--jobs", type=int, default=2, help="--jobs of the grader (default: 2)")
    parser.add_argument("--source-dir", default=None, help="the instructor's sources (default: solutions/)")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    summary = run(args.notebooks, args.copies, args.jobs, Path(args.source_dir) if args.source_dir else None)
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["full_marks"] else 1
