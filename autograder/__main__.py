"""python -m autograder {grade, demo-course, mutate}: see docs/grading.md."""
from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade submitted notebooks without an nbgrader database",
                       description="Grade notebooks: restore test / read-only cells from the source, run them in a "
                                   "fresh kernel under the integrity guard, score the graded test cells.")
    g.add_argument("notebooks", nargs="*", help="submitted .ipynb files (or folders of them)")
    g.add_argument("--json", help="where to write the grades (JSON; required unless --doctor)")
    g.add_argument("--source-dir", default="solutions",
                   help="the instructor's nbgrader source notebooks, <dir>/<assignment>/<name>.ipynb (default: solutions)")
    g.add_argument("--timeout", type=int, default=60, help="per-cell timeout in seconds (default: 60)")
    g.add_argument("--html", metavar="DIR", default=None, help="also write an HTML feedback page per notebook here")
    g.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    g.add_argument("--jobs", type=int, default=1, help="notebooks graded in parallel, one worker process and "
                                                       "sandbox each (default: 1)")
    g.add_argument("--out", metavar="DIR", default=None,
                   help="one JSON per submission here, plus summary.csv; a rerun skips what is already graded")
    g.add_argument("--budget", type=float, default=900,
                   help="time budget of one notebook in seconds, all cells and restarts together (default: 900)")
    g.add_argument("--max-notebook-mb", type=float, default=20, help="refuse larger submissions (default: 20 MB)")
    g.add_argument("--unsafe", action="store_true",
                   help="grade without a sandbox when none can be made (never for untrusted submissions)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--seed-key", default=None,
                   help="an instructor secret: hidden tests run with seeds derived from it instead of the notebooks' "
                        "own (also $AUTOGRADER_SEED_KEY, which keeps it out of the process list)")
    g.add_argument("--doctor", action="store_true",
                   help="grade nothing: show what a submission's sandbox will see (mounts, Python, imports, limits, "
                        "uid, network, the replay's isolation) by starting one; exit 0 if grading would work")

    d = sub.add_parser("demo-course", help="run the real nbgrader flow on a throwaway course directory",
                       description="generate_assignment, simulated release and collection (a perfect student, a "
                                   "student who submits the released notebook, a student with one planted bug), "
                                   "autograde, generate_feedback, export; prints the grades and checks them.")
    d.add_argument("--dir", default=None, help="course directory to create (default: a temporary one)")
    d.add_argument("--source-dir", default="solutions", help="where the nbgrader source notebooks are")
    d.add_argument("--assignment", action="append", default=None,
                   help="only these assignments (repeatable; default: every assignment in --source-dir)")
    d.add_argument("--timeout", type=int, default=120, help="per-cell timeout for nbgrader autograde (seconds)")
    d.add_argument("--keep", action="store_true", help="keep the temporary course directory")
    from .mutate import build_parser as mutate_parser

    mutate_parser(sub.add_parser("mutate", help="mutation testing of the checks (cosmic-ray mutants of the references)",
                                 description="Generate every cosmic-ray mutant of each exercise's reference solution "
                                             "and grade it with the exercise's check on every graded seed."))
    return parser


def main(argv=None) -> int:
    from .lean_imports import skip_slow_optional_imports

    skip_slow_optional_imports()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "grade":
        if args.seed_key:
            from .hidden_seeds import KEY_ENV

            os.environ[KEY_ENV] = args.seed_key  # (read by every worker; never passed into a sandbox)
        if args.doctor:
            from .doctor import doctor

            return doctor(kernel=args.kernel, source_dir=args.source_dir)
        if not args.notebooks or not args.json:
            parser.error("grade: the following arguments are required: notebooks, --json (or --doctor)")
        from .grade import main as grade_main

        return grade_main(args)
    if args.command == "mutate":
        from .mutate import main as mutate_main

        return mutate_main(args)
    from .demo_course import main as demo_main

    return demo_main(args)


if __name__ == "__main__":
    sys.exit(main())
