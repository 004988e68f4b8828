"""Generate the student notebooks (notebooks/) from the instructor sources (solutions/).

    python scripts/generate_notebooks.py           # clean solutions/, regenerate notebooks/
    python scripts/generate_notebooks.py --check   # regenerate in a temp dir; exit 1 if anything differs

For every assignment folder `solutions/<assignment>/` this runs nbgrader's generate_assignment
(solution regions become `raise NotImplementedError()`, hidden tests disappear, locked cells get
checksums), equivalent to `nbgrader generate_assignment <assignment> --force --no-db` with the
course directory configured by this script (no nbgrader_config.py involved):

    root = a temporary directory holding a copy of solutions/   (no gradebook.db lands in the repo)
    source_directory = "solutions", release_directory = "notebooks"

and then normalises what nbgrader wrote: no outputs, no execution counts, no widget state, a
`python3` kernelspec, one canonical JSON layout, and the "Open in Colab" badge and Colab install
cell rendered from course_lib/publish_settings.py (scripts/notebook_cells.py; scripts/publish.py
changes the setting). Other files of an assignment folder (data files) are copied by nbgrader as
they are.

Run All must reach the end of a student notebook whose exercises are all unfinished, so in the
student versions (only) every cell that may raise because an exercise is unfinished gets the
`raises-exception` cell tag: each autograded test cell, each cell whose code raises
NotImplementedError outside any function (a top-level solution region), and each cell the author
tagged `may-raise-unfinished` in solutions/. JupyterLab, nbclient/nbconvert and nbval go on past an
error in a cell so tagged; nbgrader and `python -m autograder grade` run every cell anyway and
grade from the outputs, so the tag changes no score (docs/run_all.md).

The sources are normalised the same way, in place (an instructor who saved a notebook with its
outputs and widget state just reruns this script). `--check` changes nothing: it fails if a source
is not normalised, or if regenerating would change anything under notebooks/ (a file that differs,
is missing, or should not be there); tests/test_notebooks.py runs it.
"""
from __future__ import annotations

import argparse
import ast
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import notebook_cells  # noqa: E402  (scripts/notebook_cells.py)

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = "solutions"
RELEASE_DIR = "notebooks"
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
RAISES_TAG = "raises-exception"  # JupyterLab, nbclient and nbval run on past an error in such a cell
AUTHOR_TAG = "may-raise-unfinished"  # an author's mark, in solutions/, for a cell the rules below miss


# ------------------------------------------------------------------------------ normalising
def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Outputs, execution counts and widget state stripped; kernelspec python3; nothing else changed."""
    nb.metadata.pop("widgets", None)  # ipywidgets' saved widget state
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    language_info = nb.metadata.get("language_info")
    nb.metadata["language_info"] = {"name": (language_info or {}).get("name", "python")}
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)  # timing metadata written by some front ends
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
    return nb


def canonical_text(nb: nbformat.NotebookNode) -> str:
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def normalised_text(path: Path, root: Path = ROOT) -> str:
    """The notebook normalised, with its badge and install cell as the publishing setting says.
    The badge of solutions/A/X.ipynb and of notebooks/A/X.ipynb both open notebooks/A/X.ipynb."""
    nb = normalise(nbformat.read(path, as_version=4))
    repo, version = notebook_cells.settings(root)
    notebook_cells.render(nb, f"{RELEASE_DIR}/{path.parent.name}/{path.name}", repo, version)
    return canonical_text(nb)


# ------------------------------------------------------------------------------ Run All goes on
def _raises_not_implemented_at_top_level(source: str) -> bool:
    """True if the cell's own code (not a function or class body) raises NotImplementedError."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics (%matplotlib): fall back to the text
        return any(line.startswith("raise NotImplementedError") for line in source.splitlines())
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                return True
        pending.extend(ast.iter_child_nodes(node))
    return False


def may_raise_when_unfinished(cell) -> bool:
    if cell.cell_type != "code":
        return False
    grading = cell.metadata.get("nbgrader", {})
    is_autograded_test = grading.get("grade", False) and not grading.get("solution", False)
    return (is_autograded_test or AUTHOR_TAG in cell.metadata.get("tags", [])
            or _raises_not_implemented_at_top_level(cell.source))


def tag_cells_that_may_raise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A student notebook: `raises-exception` on every cell that may fail only because an exercise
    is unfinished, so that Run All shows the failure and goes on (later cells fall back)."""
    for cell in nb.cells:
        if may_raise_when_unfinished(cell):
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
    return nb


# ------------------------------------------------------------------------------ generating
def assignments(source_root: Path) -> list[str]:
    return sorted(p.name for p in source_root.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def run_nbgrader(course: Path, names: list[str]) -> None:
    """`nbgrader generate_assignment NAME --force --no-db` for each name, in this process (importing
    nbgrader takes seconds; doing it once keeps `--check` quick), with the course directory
    configured here rather than in a config file."""
    import logging

    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.source_directory = SOURCE_DIR
    config.CourseDirectory.release_directory = RELEASE_DIR
    config.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"  # never the repository's
    config.GenerateAssignment.no_database = True
    config.GenerateAssignment.force = True
    config.SaveCells.enabled = False
    for name in names:
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = name
        converter = GenerateAssignment(coursedir=coursedir, config=config)
        converter.log.setLevel(logging.WARNING)
        try:
            converter.start()
        except Exception as err:  # nbgrader reports problems (e.g. bad cell metadata) by raising
            raise SystemExit(f"nbgrader generate_assignment {name} failed: {err}") from err


def generate(source_root: Path, out_root: Path, names: list[str], root: Path = ROOT) -> None:
    """Run nbgrader on a temporary copy of `source_root`; write the normalised result, tagged for
    Run All, to `out_root`."""
    with tempfile.TemporaryDirectory(prefix="nbgrader-") as tmp:
        course = Path(tmp)
        shutil.copytree(source_root, course / SOURCE_DIR,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        run_nbgrader(course, names)
        released = course / RELEASE_DIR
        for name in names:
            target = out_root / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(released / name, target)
            for path in target.rglob("*.ipynb"):
                student = nbformat.reads(normalised_text(path, root), as_version=4)
                path.write_text(canonical_text(tag_cells_that_may_raise(student)))


def differences(expected_root: Path, actual_root: Path, names: list[str]) -> list[str]:
    problems = []
    for name in names:
        exp, act = expected_root / name, actual_root / name
        exp_files = {p.relative_to(exp) for p in exp.rglob("*") if p.is_file()}
        act_files = {p.relative_to(act) for p in act.rglob("*") if p.is_file()} if act.exists() else set()
        for rel in sorted(exp_files - act_files):
            problems.append(f"missing: {RELEASE_DIR}/{name}/{rel}")
        for rel in sorted(act_files - exp_files):
            problems.append(f"not generated from {SOURCE_DIR}/ (stale?): {RELEASE_DIR}/{name}/{rel}")
        for rel in sorted(exp_files & act_files):
            if not filecmp.cmp(exp / rel, act / rel, shallow=False):
                problems.append(f"differs from a fresh generation: {RELEASE_DIR}/{name}/{rel}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if solutions/ is not normalised or notebooks/ is out of date")
    parser.add_argument("--assignment", action="append", help="only this assignment (repeatable)")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's repo)")
    args = parser.parse_args(argv)

    source_root, release_root = args.root / SOURCE_DIR, args.root / RELEASE_DIR
    names = args.assignment or assignments(source_root)
    unknown = [n for n in names if not (source_root / n).is_dir()]
    if unknown:
        parser.error(f"no such assignment under {SOURCE_DIR}/: {', '.join(unknown)}")

    problems = []
    for name in names:
        for path in sorted((source_root / name).glob("*.ipynb")):
            text = normalised_text(path, args.root)
            if path.read_text() != text:
                if args.check:
                    problems.append(f"not normalised (outputs, widget state, layout, or a badge / install cell "
                                    f"other than course_lib/publish_settings.py says): {path.relative_to(args.root)}")
                else:
                    path.write_text(text)
                    print(f"normalised {path.relative_to(args.root)}")

    if args.check:
        with tempfile.TemporaryDirectory(prefix="notebooks-") as tmp:
            generate(source_root, Path(tmp), names, args.root)
            problems += differences(Path(tmp), release_root, names)
        if problems:
            print("\n".join(problems))
            print(f"\n{len(problems)} problem(s): run `python scripts/generate_notebooks.py` and commit the result")
            return 1
        print(f"notebooks/ is up to date with solutions/ ({len(names)} assignments)")
        return 0

    release_root.mkdir(exist_ok=True)
    generate(source_root, release_root, names, args.root)
    print(f"generated {len(names)} assignments into {RELEASE_DIR}/: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
