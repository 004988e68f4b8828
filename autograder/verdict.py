"""The grader's verdict on one notebook: which checks each test cell asks for, their replay, and
feedback that never shows hidden tests.

A test cell's plan comes from its source as the *instructor* wrote it (restored from the source
notebook, so the student cannot change it): every call `check_<adapter>(<name>, seed=<int>)` in
it, parsed with `ast` (a seed that is not a literal means the exercise's graded seeds). A call
between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` is hidden: its failure message is
withheld (it would describe the hidden inputs). The cell earns its points only if it passed in
the kernel (that evidence can only lower a score) AND every planned check passes in replay.
"""
from __future__ import annotations

import ast
import importlib
import threading
from dataclasses import dataclass

_REPLAY_LOCK = threading.Lock()  # the membrane's hooks are per process: one replay at a time


@dataclass(frozen=True)
class Planned:
    exercise: str  # the adapter name: check_<exercise>
    seed: int
    hidden: bool


def cell_plan(source: str, hidden_ranges: list[tuple[int, int]]) -> list[Planned]:
    from .exercises import BY_ADAPTER

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    out: list[Planned] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if not name.startswith("check_") or not node.args:
            continue
        exercise = name.removeprefix("check_")
        seed_node = next((k.value for k in node.keywords if k.arg == "seed"), node.args[1] if len(node.args) > 1 else None)
        if seed_node is None:
            seeds = (0,)
        elif isinstance(seed_node, ast.Constant) and isinstance(seed_node.value, int):
            seeds = (seed_node.value,)
        else:
            e = BY_ADAPTER.get(exercise)
            seeds = e.graded_seeds if e else (0,)
        hidden = any(first <= node.lineno <= last for first, last in hidden_ranges)
        for seed in seeds:
            p = Planned(exercise, int(seed), hidden)
            if p not in out:
                out.append(p)
    return out


def find_check(exercise: str):
    """The grader's own check function for an exercise (None if there is none)."""
    from .checks import CHECKS, MODULES

    modules = [CHECKS[exercise]] if exercise in CHECKS else list(MODULES)
    for module in modules:
        try:
            fn = getattr(importlib.import_module(f"autograder.checks.{module}"), f"check_{exercise}", None)
        except ImportError:
            continue
        if fn is not None:
            return fn
    return None


def replay_plan(plans: dict[str, list[Planned]], entries: list[dict]) -> dict[tuple[str, int], tuple[bool, str]]:
    """(exercise, seed) -> (passed, message) for every planned check, replayed from the record."""
    from .replay import replay

    wanted = {(p.exercise, p.seed) for plan in plans.values() for p in plan}
    results: dict[tuple[str, int], tuple[bool, str]] = {}
    by_key: dict[tuple[str, int], list[dict]] = {}
    for entry in entries:
        by_key.setdefault((entry["exercise"], entry["seed"]), []).append(entry)
    for key in sorted(wanted):
        exercise, seed = key
        fn = find_check(exercise)
        if fn is None:
            results[key] = (False, f"the grader has no check_{exercise}")
            continue
        recorded = by_key.get(key, [])
        if not recorded:
            results[key] = (False, f"check_{exercise}(seed={seed}) never ran in the sandbox (the test cell stopped "
                                   "before it, or its record was lost)")
            continue
        verdict = (True, "")
        for entry in recorded[:4]:
            with _REPLAY_LOCK:
                ok, message = replay(fn, entry)
            if not ok:
                verdict = (False, message)
                break
        results[key] = verdict
    return results


HIDDEN_MESSAGE = ("a hidden test of {exercise} failed; its message is withheld because it would show the hidden "
                  "inputs. Test your code on more cases than the visible ones.")


def cell_verdict(plan: list[Planned], results) -> tuple[bool, str]:
    """(passed, feedback) of a test cell's planned checks."""
    for p in sorted(plan, key=lambda p: p.hidden):
        ok, message = results.get((p.exercise, p.seed), (False, "not replayed"))
        if not ok:
            return False, HIDDEN_MESSAGE.format(exercise=p.exercise) if p.hidden else message
    return True, ""


class Redactor:
    """Removes every line of the source's hidden tests from text shown to the student."""

    def __init__(self, hidden_lines: list[str]):
        self.lines = sorted({line for line in hidden_lines if len(line) >= 8}, key=len, reverse=True)

    def __call__(self, text):
        if not isinstance(text, str) or not self.lines:
            return text
        for line in self.lines:
            if line in text:
                text = text.replace(line, "[hidden test]")
        return text
