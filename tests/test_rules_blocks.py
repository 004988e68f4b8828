"""Every exercise states its rules in one collapsed block, and a failing check names the rule it broke.

Course v3 shows the goal, the interface and a worked example; the full rule list sits in a collapsed
`<details><summary>The rules the check holds you to</summary>` block of numbered items, each opening
with its bold short name (`1. **all or nothing**: ...`). A check that fails says `Rule "<name>": ...`
(`autograder._checking.broke`, or `expect(..., rule=...)`), so a student who designed it differently
knows which rule to open. These tests hold the two sides to each other, read from the sources: every
rule a check can name is in its notebook's blocks, and every rule a block states is named by a check.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from autograder.exercises import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = "<summary>The rules the check holds you to</summary>"
RULE_ITEM = re.compile(r"^\s*\d+\.\s+\*\*([^*]+)\*\*", re.M)
MODULES = sorted({e.module for e in EXERCISES})


def rules_blocks(assignment: str) -> list[list[str]]:
    """The rule names of each rules block in the solution notebook, in order."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    blocks = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for part in cell.source.split(SUMMARY)[1:]:
            body = part.split("</details>", 1)[0]
            blocks.append(RULE_ITEM.findall(body))
    return blocks


def _strings(node) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def named_rules(module: str) -> tuple[dict[str, int], set[str]]:
    """(rule name -> line, every string in the module), read from the checks module's source. The
    rules a check names: the strings written in broke("<rule>", ...)'s and naming_rule("<rule>")'s first argument and in
    expect(..., rule="<rule>") (a conditional picks among literals); a rule chosen at run time (a
    variable) must still be written somewhere in the module, as one of its strings."""
    package = ROOT / "autograder" / "checks" / module  # `_shared`, one file per exercise, the package's names
    tree = ast.Module(body=[node for path in sorted(package.glob("*.py"))
                            for node in ast.parse(path.read_text(encoding="utf-8")).body], type_ignores=[])
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        if name in ("broke", "naming_rule") and node.args:
            arg = node.args[0]
        elif name == "expect":
            arg = next((k.value for k in node.keywords if k.arg == "rule"), None)
        else:
            continue
        for rule in _strings(arg) if arg is not None else ():
            found.setdefault(rule, node.lineno)
    return found, set(_strings(tree))


@pytest.mark.parametrize("module", MODULES)
def test_every_exercise_has_one_rules_block(module):
    exercises = [e for e in EXERCISES if e.module == module]
    blocks = rules_blocks(exercises[0].assignment)
    assert len(blocks) == len(exercises), (
        f"{exercises[0].assignment}: {len(blocks)} rules blocks ({SUMMARY!r}) for {len(exercises)} exercises")
    for block in blocks:
        assert block, "a rules block lists no rule: items are `1. **<short name>**: <the rule>`"
        assert len(set(block)) == len(block), f"a rule name repeats within one block: {block}"


@pytest.mark.parametrize("module", MODULES)
def test_checks_and_rules_blocks_name_the_same_rules(module):
    assignment = module[2:]
    stated = {name for block in rules_blocks(assignment) for name in block}
    named, strings = named_rules(module)
    unknown = {name: line for name, line in named.items() if name not in stated}
    assert not unknown, (f"autograder/checks/{module}/ names rules that no rules block of {assignment} states "
                         f"(name: line): {unknown}")
    unnamed = sorted(stated - strings)
    assert not unnamed, (f"{assignment} states rules that autograder/checks/{module}/ never names when it fails "
                         f"(broke(...) / expect(..., rule=...)): {unnamed}")
