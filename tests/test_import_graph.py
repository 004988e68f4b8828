"""The autograder's modules import one another without a cycle (issue 26): every import counts, the
ones inside functions too (a cycle through a late import is a cycle all the same: two modules that
cannot be understood, or moved, one without the other), and every module imports by itself."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
# Run as programs, not imported: the command line, and nbgrader's config file (it calls get_config()).
NOT_IMPORTED = {"autograder.__main__", "autograder.nbgrader_config"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(name: str, path: Path) -> set[str]:
    """The autograder modules `name` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{prefix}.{alias.name}" for alias in node.names]  # a submodule, or a name in `prefix`
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_autograder_module_imports_itself_back():
    graph = {name: _imported(name, path) for name, path in MODULES.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(set(MODULES) - NOT_IMPORTED))
def test_every_module_imports(name):
    importlib.import_module(name)


def _expect_each_reloaded_after_what_it_imports(order: list[str]) -> None:
    for position, name in enumerate(order):
        late = sorted(d for d in _imported(name, MODULES[name]) if d in order and order.index(d) > position)
        assert not late, f"{name} is reloaded before {late}, which it imports"


def test_the_guard_reloads_each_check_helper_before_the_modules_that_import_it():
    """The grader's guard reloads the checks' modules from disk before every graded cell, in
    `autograder.integrity._RELOAD_FIRST`'s order. `_checking` re-exports its helper modules' names, so a
    helper reloaded after it (or not at all) would leave the checks holding what a submission made of it."""
    from autograder.integrity import _RELOAD_FIRST

    order = list(_RELOAD_FIRST)
    _expect_each_reloaded_after_what_it_imports(order)
    checking = ast.parse(MODULES["autograder._checking"].read_text(encoding="utf-8"))
    sources = {f"autograder.{node.module}" for node in checking.body
               if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    missing = sorted(s for s in sources if s in MODULES and s not in order)
    assert not missing, f"_checking re-exports names from modules the guard never reloads: {missing}"


def test_the_guard_reloads_each_check_file_before_the_files_and_package_that_import_it():
    """Each notebook's checks are a package (`_shared`, one file per exercise, the package's names): the
    guard reloads them in `check_reload_order`, which must put every check module after the ones it imports,
    or a reloaded module would keep what a submission made of an older one."""
    from autograder.integrity import check_reload_order

    checks = [n for n in MODULES if n.startswith("autograder.checks.")]
    order = check_reload_order(checks)
    assert sorted(order) == sorted(checks)
    _expect_each_reloaded_after_what_it_imports(order)


def test_the_check_reload_order_puts_a_package_after_its_files():
    from autograder.integrity import check_reload_order

    assert check_reload_order(["autograder.checks.nb0.b", "autograder.checks.nb0", "autograder.checks.nb0._shared",
                               "autograder.checks.nb0.a"]) == [
        "autograder.checks.nb0._shared", "autograder.checks.nb0.a", "autograder.checks.nb0.b", "autograder.checks.nb0"]
