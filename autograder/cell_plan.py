"""The checks a test cell asks for: every call `check_<adapter>(<name>, seed=<int>)` in its source,
parsed with `ast`, each with its seed and whether it is hidden (see `autograder.verdict`)."""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Planned:
    exercise: str  # the adapter name: check_<exercise>
    seed: int
    hidden: bool


def check_calls(tree):
    """(exercise, the seed's node or None, the call) for every `check_<exercise>(impl, ...)` in `tree`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if not name.startswith("check_") or not node.args:
            continue
        seed = next((k.value for k in node.keywords if k.arg == "seed"), node.args[1] if len(node.args) > 1 else None)
        yield name.removeprefix("check_"), seed, node


def plan_cell(source: str, hidden_ranges: list[tuple[int, int]], visible_seed) -> list[Planned]:
    """The checks a test cell asks for; `visible_seed(exercise)`: the seed of a call written without one."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    calls = []  # (exercise, literal seed or None when not a literal, line)
    for exercise, seed_node, node in check_calls(tree):
        visible = visible_seed(exercise)
        if seed_node is None:
            seed = visible
        elif isinstance(seed_node, ast.Constant) and type(seed_node.value) is int:
            seed = seed_node.value
        else:
            seed = None
        calls.append((exercise, seed, visible, node.lineno))
    out: list[Planned] = []
    for exercise, seed, visible, lineno in calls:
        if seed is not None:
            seeds = (seed,)
        else:  # a seed computed at run time: the cell's literal seeds of that check (and the visible one)
            seeds = tuple(dict.fromkeys([visible] + [s for e, s, _, _ in calls if e == exercise and s is not None]))
        hidden = any(first <= lineno <= last for first, last in hidden_ranges)
        for one in seeds:
            p = Planned(exercise, int(one), hidden)
            if p not in out:
                out.append(p)
    return out
