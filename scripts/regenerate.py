"""Run every generator of the repository, in the order their inputs require.

    python scripts/regenerate.py           # regenerate everything that is generated
    python scripts/regenerate.py --check   # change nothing; exit 1 naming each generated file that is stale

What is generated, from what (each generator also runs alone, with the same `--check`):

1. scripts/generate_notebooks.py: normalises solutions/ in place (outputs, widget state, badge and
   Colab install cell from course_lib/publish_settings.py), then writes notebooks/ from solutions/
   with nbgrader. ~12 s on a 2-core machine (nbgrader on eight notebooks): the slow one.
2. scripts/extract_references.py: autograder/reference/*.py from the solution cells of solutions/.
   After 1, because 1 rewrites solutions/.
3. scripts/build_exercises_doc.py: docs/exercises.md from autograder/exercises.py and
   docs/exercises/*.md.
4. scripts/build_grading_tables.py: the generated blocks of docs/grading.md (check table,
   definitions, mutation table) from autograder/exercises.py and docs/mutation_report.json.

3 and 4 read only the table of exercises and hand-written files, so they could run in any order
relative to 1 and 2; they run last so that one command after editing anything leaves everything
fresh. In write mode a failing generator stops the run (what follows may read its output); with
`--check` every generator runs and all the stale ones are named.

Not run here, on purpose: scripts/publish.py (changes the publishing setting, then runs 1 itself),
`python -m autograder mutate` (measures: minutes; merge its report with
`scripts/build_grading_tables.py --mutation-json`), scripts/train_tiny.py (trains the tiny model),
scripts/build_package.py (builds a wheel, generates nothing in the repository).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Generator:
    script: str  # under scripts/
    writes: str  # what it generates, in words (named when it is stale)


GENERATORS = [
    Generator("generate_notebooks.py", "notebooks/ (and normalised solutions/)"),
    Generator("extract_references.py", "autograder/reference/*.py"),
    Generator("build_exercises_doc.py", "docs/exercises.md"),
    Generator("build_grading_tables.py", "docs/grading.md's generated blocks"),
]


def run(generators: list[Generator], check: bool, root: Path = ROOT) -> list[str]:
    """Run each generator (with --check if `check`); the problems, one line per failing generator."""
    problems = []
    for gen in generators:
        command = [sys.executable, str(root / "scripts" / gen.script)] + (["--check"] if check else [])
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        output = (done.stdout + done.stderr).strip()
        status = "ok" if done.returncode == 0 else ("STALE" if check else "FAILED")
        print(f"[{status}] {gen.script} ({gen.writes}) {seconds:.1f} s")
        if done.returncode != 0:
            detail = "\n    ".join(output.splitlines()[-15:])
            problems.append(f"{gen.writes}: scripts/{gen.script} --check says it is out of date (or could not "
                            f"run):\n    {detail}" if check
                            else f"scripts/{gen.script} failed (exit {done.returncode}):\n    {detail}")
            if not check:
                break
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming every generated file that is out of date")
    args = parser.parse_args(argv)
    problems = run(GENERATORS, args.check)
    if problems:
        print("\n" + "\n".join(problems))
        print(f"\n{len(problems)} generator(s) " + ("found stale files: run python scripts/regenerate.py"
                                                     if args.check else "failed: the ones after it did not run"))
        return 1
    print("everything generated is up to date" if args.check else "regenerated everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
