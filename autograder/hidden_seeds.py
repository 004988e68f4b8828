"""The hidden tests' seeds live only on the instructor's side.

The truth is the literal `seed=<int>` of each check call between `### BEGIN HIDDEN TESTS` and
`### END HIDDEN TESTS` in the source notebooks (`solutions/`: never in the wheel, never mounted in
a sandbox). The table of exercises (autograder/exercises.py, which ships) keeps only the visible
seed; whatever needs the graded seeds (the tests, `python -m autograder mutate`, docs) reads them
from the solution notebook with `graded_seeds(exercise)`, parsed by the grader's own logic
(`cell_plan.plan_cell`; `autograder.solution_seeds`).

A student with the public repository can still read `solutions/`. With an instructor secret
(`python -m autograder grade --seed-key KEY`, or AUTOGRADER_SEED_KEY), the grader derives each
hidden call's seed from the key (HMAC-SHA256 of the exercise and the written seed: the same for
every submission of a course, another for another key) and rewrites the restored hidden test cells
before they run, so that the hidden inputs depend on something no student has. The checks accept
any int seed (tests/test_hidden_seeds.py holds every reference and control to a few random ones).
"""
from __future__ import annotations

import ast
import copy
import hashlib
import hmac
import os
import re

from .solution_seeds import (ROOT, SOLUTIONS, NoSolutions, _test_cells, graded_seeds,  # noqa: F401
                             seeds_in_cell, solution_notebook)

KEY_ENV = "AUTOGRADER_SEED_KEY"
VISIBLE_SEED = 0  # the seed of a check call written without one (the visible test)
_DERIVED_FLOOR = 1000  # derived seeds stay clear of the small seeds a student would try first


def cell_seeds(source: str, exercise: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(visible, hidden) seeds of the check_<exercise> calls in one test cell's source, in order."""
    from .exercises import BY_ADAPTER

    return seeds_in_cell(source, exercise, getattr(BY_ADAPTER.get(exercise), "visible_seed", 0))


# ------------------------------------------------------------------------------ the instructor's key


def seed_key(key: str | None = None) -> str | None:
    """The key to derive hidden seeds from: `key`, else $AUTOGRADER_SEED_KEY, else None (the
    notebooks' own seeds are used)."""
    return key if key else (os.environ.get(KEY_ENV) or None)


def derived_seed(key: str, exercise: str, seed: int) -> int:
    """The seed a hidden `check_<exercise>(..., seed=<seed>)` runs with under `key`."""
    digest = hmac.new(key.encode("utf-8"), f"{exercise}\0{seed}".encode("utf-8"), hashlib.sha256).digest()
    return _DERIVED_FLOOR + int.from_bytes(digest[:4], "big") % (2**31 - _DERIVED_FLOOR)


def _hidden_seed_literals(source: str):
    """(line, col, end_col, exercise, seed) of every literal int seed of a check call in a hidden block."""
    from .notebook_cells import hidden_line_ranges

    ranges = hidden_line_ranges(source)
    if not ranges:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    from .verdict import check_calls

    found = []
    for exercise, seed, _ in check_calls(tree):
        if (isinstance(seed, ast.Constant) and type(seed.value) is int and seed.lineno == seed.end_lineno
                and any(first <= seed.lineno <= last for first, last in ranges)):
            found.append((seed.lineno, seed.col_offset, seed.end_col_offset, exercise, seed.value))
    return found


def rewrite_cell(source: str, key: str) -> str:
    """`source` with every literal seed of a hidden check call replaced by its derived seed."""
    literals = _hidden_seed_literals(source)
    if not literals:
        return source
    lines = source.split("\n")
    taken, derived = {VISIBLE_SEED}, {}
    for _, _, _, exercise, seed in sorted(literals):
        if (exercise, seed) not in derived:
            new = derived_seed(key, exercise, seed)
            while new in taken:  # (two seeds of a cell never meet: about one cell in a billion moves on)
                new += 1
            taken.add(new)
            derived[(exercise, seed)] = new
    for lineno, col, end_col, exercise, seed in sorted(literals, key=lambda x: (-x[0], -x[1])):
        new = derived[(exercise, seed)]
        # ast's columns count UTF-8 bytes: slice the line as bytes
        raw = lines[lineno - 1].encode("utf-8")
        lines[lineno - 1] = (raw[:col] + str(new).encode() + raw[end_col:]).decode("utf-8")
    return "\n".join(lines)


def keyed_source(nb, key: str | None = None):
    """The source notebook as the grader runs it: with a key (argument or $AUTOGRADER_SEED_KEY),
    a copy whose hidden test cells call the checks with the derived seeds; without one, `nb`."""
    key = seed_key(key)
    if not key:
        return nb
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") == "code" and (cell.get("metadata", {}).get("nbgrader") or {}).get("grade"):
            cell["source"] = rewrite_cell(cell.get("source", ""), key)
    return nb


# ------------------------------------------------------------------- what the student is shown of them

_SEEDS_SHOWN = re.compile(r"(seeds?[=: ]\s*)(-?\d+(?:\s*,\s*-?\d+)*)")
HIDDEN_SEED = "hidden"
_NOT_MESSAGES = ("path", "source", "submission_sha256", "html", "student", "notebook")  # (the grader's own fields)


def _hide_text(text: str, seeds: set[int], long_seeds: list[str]) -> str:
    def one(match):
        numbers = [n.strip() for n in match.group(2).split(",")]
        return match.group(1) + ", ".join(HIDDEN_SEED if int(n) in seeds else n for n in numbers)

    text = _SEEDS_SHOWN.sub(one, text)
    for digits in long_seeds:  # a derived seed has 4 to 10 digits: it is hidden wherever it turns up
        text = text.replace(digits, HIDDEN_SEED)
    return text


def hide_in(value, seeds: set[int]):
    """`value` (a result entry: dicts, lists, strings) with every hidden seed shown as "hidden":
    `seed=1` in a message, a `"seed": 1` field (with `"hidden": true` beside it), and a derived
    seed's digits anywhere. The hidden seeds are the inputs' secret: feedback names none."""
    seeds = {s for s in seeds if type(s) is int}
    long_seeds = sorted((str(s) for s in seeds if abs(s) >= _DERIVED_FLOOR), key=len, reverse=True)

    def walk(v):
        if isinstance(v, str):
            return _hide_text(v, seeds, long_seeds)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            out = {k: x if k in _NOT_MESSAGES else walk(x) for k, x in v.items()}
            if type(v.get("seed")) is int and v["seed"] in seeds:
                out["seed"], out["hidden"] = None, True
            return out
        return v

    return walk(value)
