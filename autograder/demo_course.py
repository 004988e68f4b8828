"""`python -m autograder demo-course [--dir DIR]`: the instructor's nbgrader flow, end to end.

In a throwaway course directory, with nbgrader itself (its Python API: what each command runs; the
equivalent command is printed) configured by autograder/nbgrader_config.py:

1. `nbgrader generate_assignment` for every assignment in `--source-dir` (default `solutions/`);
2. "release" and "collect": three students submit into `submitted/<student>/<assignment>/`:
   `perfect` (the solutions), `untouched` (the released notebook as is), `buggy` (the solutions
   with one realistic bug planted from autograder.mutants);
3. `nbgrader autograde`, `nbgrader generate_feedback`, `nbgrader export`;
4. prints the grades and checks them: perfect = full marks, untouched = 0, buggy < full marks.

nbgrader's commands can exit 0 after a failure, so every step is judged by what it produced
(release notebooks, autograded notebooks, feedback pages, the exported scores), not by exit codes.
"""
from __future__ import annotations

import csv
import datetime
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat

from .submissions import mutant_for, perfect_submission, plant_mutant

HERE = Path(__file__).resolve().parent
STUDENTS = ("perfect", "untouched", "buggy")


class DemoError(RuntimeError):
    pass


class _Nbgrader:
    """nbgrader's own Python API (what its command line runs), configured by
    autograder/nbgrader_config.py, pointed at the demo course. In-process, so nbgrader's slow
    imports are paid once, not once per command."""

    ENV = ("AUTOGRADER_COURSE_ROOT", "AUTOGRADER_SOURCE_DIR", "AUTOGRADER_RELEASE_DIR", "AUTOGRADER_STATE_DIR",
           "AUTOGRADER_CELL_TIMEOUT", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "PYTHONHASHSEED")

    def __init__(self, course: Path, timeout: int, log: list[str]):
        self.log = log
        self._saved = {k: os.environ.get(k) for k in self.ENV}
        os.environ.update(AUTOGRADER_COURSE_ROOT=str(course), AUTOGRADER_SOURCE_DIR="source",
                          AUTOGRADER_RELEASE_DIR="release", AUTOGRADER_STATE_DIR=".",
                          AUTOGRADER_CELL_TIMEOUT=str(timeout), OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
                          PYTHONHASHSEED="0")
        from nbgrader.apps import NbGraderAPI
        from traitlets.config.loader import PyFileConfigLoader

        self.config = PyFileConfigLoader("nbgrader_config.py", path=str(HERE)).load_config()
        self.api = NbGraderAPI(config=self.config)

    def close(self):
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def run(self, command: str, fn, *args):
        t0 = time.monotonic()
        result = fn(*args)
        self.log.append(f"$ nbgrader {command}  ({'ok' if result.get('success') else 'FAILED'}, "
                        f"{time.monotonic() - t0:.1f} s)\n{result.get('log', '')}{result.get('error') or ''}")
        if not result.get("success"):
            raise DemoError(f"nbgrader {command} failed:\n{(result.get('error') or result.get('log') or '')[-3000:]}")
        return result

    def export(self, dest: Path):
        from nbgrader.api import Gradebook
        from nbgrader.plugins import CsvExportPlugin

        t0 = time.monotonic()
        plugin = CsvExportPlugin(config=self.config)
        plugin.to = str(dest)
        coursedir = self.api.coursedir
        with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
            plugin.export(gb)
        self.log.append(f"$ nbgrader export --to {dest}  ({time.monotonic() - t0:.1f} s)")


def assignments_in(source_dir: Path, only=None) -> list[str]:
    names = sorted(p.name for p in source_dir.iterdir()
                   if p.is_dir() and any(p.glob("*.ipynb")) and not p.name.startswith("."))
    if only:
        missing = set(only) - set(names)
        if missing:
            raise DemoError(f"no such assignment(s) in {source_dir}: {', '.join(sorted(missing))}")
        names = [n for n in names if n in only]
    return names


def run_demo(course_dir=None, source_dir="solutions", assignments=None, timeout=120, keep=False, echo=print) -> dict:
    """Run the whole flow; returns {"course_dir", "grades": {(assignment, student): (score, max)}, "ok", ...}."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's SQLAlchemy warnings say nothing about the grades
        return _run_demo(course_dir, source_dir, assignments, timeout, keep, echo)


def _run_demo(course_dir, source_dir, assignments, timeout, keep, echo) -> dict:
    source_dir = Path(source_dir).resolve()
    if not source_dir.is_dir():
        raise DemoError(f"source directory {source_dir} does not exist")
    names = assignments_in(source_dir, assignments)
    if not names:
        raise DemoError(f"no assignments (folders with notebooks) in {source_dir}")
    temporary = course_dir is None
    course = Path(course_dir or tempfile.mkdtemp(prefix="demo-course-")).resolve()
    course.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    started = time.monotonic()
    expected: dict[tuple[str, str], str] = {}
    nbgrader = None
    try:
        for name in names:
            shutil.copytree(source_dir / name, course / "source" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        echo(f"course directory: {course}")
        nbgrader = _Nbgrader(course, timeout, log)
        for name in names:
            echo(f"[{name}] nbgrader generate_assignment {name} --force")
            nbgrader.run(f"generate_assignment {name}", nbgrader.api.generate_assignment, name)
            released = sorted((course / "release" / name).glob("*.ipynb"))
            if not released:
                raise DemoError(f"generate_assignment produced no notebook in release/{name}")
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
            for nb_path in released:
                release = nbformat.read(nb_path, as_version=4)
                source = nbformat.read(course / "source" / name / nb_path.name, as_version=4)
                subs = {"perfect": perfect_submission(source, release), "untouched": release}
                planted = mutant_for(course / "source" / name / nb_path.name, source)
                if planted is not None:
                    buggy = plant_mutant(subs["perfect"], *planted)
                    if buggy is not None:
                        subs["buggy"] = buggy
                        expected[(name, "buggy")] = f"loses the marks of {planted[0]} ({planted[1].__name__})"
                for student, nb in subs.items():
                    folder = course / "submitted" / student / name
                    folder.mkdir(parents=True, exist_ok=True)
                    nbformat.write(nb, folder / nb_path.name)
                    (folder / "timestamp.txt").write_text(stamp)
            for student in subs:
                echo(f"[{name}] nbgrader autograde {name} --student {student} --force")
                nbgrader.run(f"autograde {name} --student {student}", nbgrader.api.autograde, name, student)
            for student in subs:
                if not list((course / "autograded" / student / name).glob("*.ipynb")):
                    raise DemoError(f"autograde produced nothing for {student}/{name}; log:\n{log[-1][-3000:]}")
            echo(f"[{name}] nbgrader generate_feedback {name} --force")
            nbgrader.run(f"generate_feedback {name}", nbgrader.api.generate_feedback, name)
            for student in subs:
                if not list((course / "feedback" / student / name).glob("*.html")):
                    raise DemoError(f"generate_feedback produced no page for {student}/{name}")
        echo("nbgrader export --to grades.csv")
        nbgrader.export(course / "grades.csv")
        grades = {}
        with open(course / "grades.csv", newline="") as f:
            for row in csv.DictReader(f):
                grades[(row["assignment"], row["student_id"])] = (float(row["score"] or 0), float(row["max_score"] or 0))
        problems = []
        for name in names:
            for student in STUDENTS:
                if (name, student) not in grades:
                    if student != "buggy" or (name, "buggy") in expected:
                        problems.append(f"{name}/{student}: no grade exported")
                    continue
                score, max_score = grades[(name, student)]
                if max_score <= 0:
                    problems.append(f"{name}: max_score is 0 (no graded test cells?)")
                elif student == "perfect" and score != max_score:
                    problems.append(f"{name}/perfect: {score:g} / {max_score:g}, expected full marks")
                elif student == "untouched" and score != 0:
                    problems.append(f"{name}/untouched: {score:g} / {max_score:g}, expected 0")
                elif student == "buggy" and not score < max_score:
                    problems.append(f"{name}/buggy: {score:g} / {max_score:g}, expected to lose marks")
        echo("")
        echo(f"{'assignment':<28}" + "".join(f"{s:>14}" for s in STUDENTS))
        for name in names:
            cells = [grades.get((name, s)) for s in STUDENTS]
            echo(f"{name:<28}" + "".join(f"{'-':>14}" if g is None else f"{g[0]:>8g} / {g[1]:<3g}" for g in cells))
        for (name, _), what in sorted(expected.items()):
            echo(f"  {name}: the buggy submission {what}")
        where = (f"feedback pages: {course / 'feedback'}   grades: {course / 'grades.csv'}"
                 if not temporary or keep else "(temporary course directory removed: pass --dir or --keep to look inside)")
        echo(f"\n{where}   ({time.monotonic() - started:.0f} s)")
        if problems:
            echo("PROBLEMS:\n  " + "\n  ".join(problems))
        else:
            echo("OK: perfect = full marks, untouched = 0, buggy < full marks for every assignment")
        return {"course_dir": str(course), "grades": grades, "problems": problems, "ok": not problems, "log": log}
    finally:
        if nbgrader is not None:
            nbgrader.close()
        if temporary and not keep:
            shutil.rmtree(course, ignore_errors=True)


def main(args) -> int:
    try:
        result = run_demo(args.dir, args.source_dir, args.assignment, args.timeout, args.keep)
    except DemoError as err:
        print(f"demo-course failed: {err}", file=sys.stderr)
        return 1
    return 0 if result["ok"] else 1
