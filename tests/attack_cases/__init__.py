"""Attack cases graded in tests/test_grade_attacks.py's ONE batch run, one module per area.

Each module of this package defines `CASES: list[AttackCase]`. A case writes its submission(s)
through a `Builder` (the course's trimmed solution notebooks, the honest answer, a folder per
student) and, once the whole batch (every case, the honest submissions first and last) has been
graded by `python -m autograder grade`'s own code, asserts on what came out through a `Graded`.
Modules are found by name (pkgutil), so an area adds its file and nothing else.
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat
from nbformat.v4 import new_code_cell

from autograder import grade as G
from autograder.submissions import perfect_submission, released_submission, with_answer

ROOT = Path(__file__).resolve().parents[2]
KV = ("00_setup", "kv_bytes_per_token", "kv_bytes_per_token_tests")  # (assignment, answer cell, test cell)
PAD = ("01_static_batching", "pad_batch", "pad_batch_tests")
MAX = 1.0  # kv_bytes_per_token's points
PREAMBLE = "import torch\n\nfrom course_lib.course import checking"  # what the two cells need

# Right only on the test cell's visible example: every check seed fails.
WRONG = '''def kv_bytes_per_token(config, bytes_per_elem):
    if (config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_elem) == (1, 1, 4, 4):
        return 32
    return 0
'''
# The right answer, written as a student would.
RIGHT = '''def kv_bytes_per_token(config, bytes_per_elem):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem
'''


def trimmed_source(which=KV):
    """The solution notebook of `which` with only its exercise: a preamble, the answer cell and its
    test cell (the rest of the notebook would only make every kernel slower)."""
    assignment, answer_id, test_id = which
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    nb.cells = [new_code_cell(PREAMBLE)] + [c for c in nb.cells if G.grade_id(c) in (answer_id, test_id)]
    return nb


def honest(source):
    return perfect_submission(source, released_submission(source))


# The grader runs no cell past the last graded test (autograder.grade.unneeded_from), so code meant
# to run once the test cell has written its record is registered before it, as a student who knows
# that rule would: an IPython hook that fires after the first graded test cell (the grader's
# completion marker is in its source as the kernel runs it), registered through a string so that
# the static scan's names (get_ipython) do not zero the notebook before the replay is tested.
AFTER_THE_TEST = """def _after_the_test(result, _done=[], _snippets={snippets!r}):
    if not _done and "[autograder] completion " + "marker" in (result.info.raw_cell or ""):  # (not this cell's own)
        _done.append(True)
        for snippet in _snippets:
            exec(snippet, globals())


exec("get_" + "ipython().events.register('post_run_cell', _after_the_test)")  # (past the name scan)
"""


def attack(source, code: str, after=(), which=KV):
    """The perfect submission with the exercise's answer cell holding `code`, and the code `after`
    run once the test cell has run (registered in a cell just before the answer)."""
    nb = with_answer(honest(source), which[1], code)
    if after:
        index = next(i for i, c in enumerate(nb.cells)
                     if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == which[1])
        nb.cells.insert(index, new_code_cell(AFTER_THE_TEST.format(snippets=list(after))))
    return nb


def write(base: Path, student: str, nb, which=KV, assignment: str | None = None) -> Path:
    """submitted/<student>/<assignment>/<assignment>.ipynb (nbgrader's layout)."""
    folder = assignment or which[0]
    path = base / "submitted" / student / folder / f"{which[0]}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def write_sources(base: Path) -> tuple[Path, dict]:
    source_dir, sources = base / "source", {}
    for which in (KV, PAD):
        sources[which] = trimmed_source(which)
        (source_dir / which[0]).mkdir(parents=True)
        nbformat.write(sources[which], source_dir / which[0] / f"{which[0]}.ipynb")
    return source_dir, sources


@dataclass
class Builder:
    """What a case may use to write its submissions."""
    base: Path  # the batch's folder: submitted/ lies in it
    source_dir: Path
    sources: dict  # KV / PAD -> the trimmed source notebook

    def honest(self, which=KV):
        return honest(self.sources[which])

    def attack(self, code: str, after=(), which=KV):
        return attack(self.sources[which], code, after, which)

    def write(self, student: str, nb, which=KV, assignment: str | None = None) -> Path:
        return write(self.base, student, nb, which, assignment)


@dataclass
class Graded:
    """The batch's outcome, for the cases' assertions."""
    base: Path
    result: dict  # what grade() returned
    by: dict  # student folder name -> its entry
    out: Path  # results/ (one JSON each, summary.csv)
    html: Path  # feedback pages

    def texts(self, student: str) -> str:
        """Everything the student (and the instructor) is shown: the JSON entry and the HTML page."""
        entry = self.by[student]
        page = Path(entry["html"]).read_text(encoding="utf-8") if entry.get("html") else ""
        return json.dumps(entry) + page


@dataclass
class AttackCase:
    name: str  # the test's id (and usually the student's folder name)
    build: Callable[[Builder], list[Path]]  # writes the submission(s) under builder.base / "submitted"
    expect: Callable[[Graded], None]  # raises AssertionError when the attack worked
    honest: bool = field(default=False)  # an honest submission: its grade must not move


def only_areas() -> set[str] | None:
    """ATTACK_AREAS=replay,inert: a development run of those areas' cases alone (with the honest
    submissions); unset (as in CI): every attack of test_grade_attacks.py and every area."""
    value = os.environ.get("ATTACK_AREAS", "").strip()
    return {a.strip() for a in value.split(",") if a.strip()} or None


def all_cases() -> list[AttackCase]:
    cases: list[AttackCase] = []
    areas = only_areas()
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if areas is not None and info.name not in areas:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        cases += getattr(module, "CASES", [])
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), f"two attack cases share a name: {sorted(names)}"
    return cases
