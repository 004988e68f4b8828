"""docs/adding_an_exercise.md is the maintainer's one checklist (issue 26): every test it names must exist,
and its table of the notebooks' check tests (step 7) must have a row for every such file, so the doc
cannot silently fall behind a renamed test or a new notebook."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "adding_an_exercise.md").read_text()
TEST_SOURCES = {path: path.read_text() for path in (ROOT / "tests").glob("*.py")}


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*def {re.escape(name)}\b", source, re.M) is not None


def test_every_file_and_test_it_names_exists():
    named = set(re.findall(r"`([\w/]+\.py)::(\w+)`", DOC))
    assert named, "the doc names its tests as `file::test`"
    missing = [f"{f}::{t}" for f, t in sorted(named)
               if not (ROOT / f).is_file() or not _defines((ROOT / f).read_text(), t)]
    assert not missing, f"the doc names tests that do not exist: {missing}"


def test_every_bare_test_name_it_uses_exists():
    named = set(re.findall(r"`(test_\w+)`", DOC))
    missing = sorted(t for t in named if not any(_defines(s, t) for s in TEST_SOURCES.values()))
    assert not missing, f"the doc names tests that no file under tests/ defines: {missing}"


def test_the_check_tests_table_has_a_row_for_every_notebook():
    files = sorted(p.stem.removeprefix("test_checks_") for p in (ROOT / "tests").glob("test_checks_nb*.py"))
    rows = set(re.findall(r"^\| `(nb\d\d)` \|", DOC, re.M))
    assert files and not set(files) - rows, f"step 7's table lacks rows for {sorted(set(files) - rows)}"
    assert not rows - set(files), f"step 7's table has rows for no test file: {sorted(rows - set(files))}"


def test_every_repository_path_it_names_exists():
    """A file the checklist sends the maintainer to (`course_lib/...`, `autograder/...`, `tests/...`,
    `scripts/...`, `docs/...`) is there; paths with a placeholder (`<module>`, `nbXX`) are patterns."""
    named = set(re.findall(r"`((?:course_lib|autograder|tests|scripts|docs)/[\w./-]+)`", DOC))
    named.discard("tests/test_kv_waste.py")  # the file the doc tells a maintainer to create
    missing = sorted(p for p in named if "XX" not in p and not (ROOT / p.rstrip("/")).exists()
                     and not (ROOT / f"{p}.py").exists())  # a module named by its path without .py
    assert named and not missing, f"the doc names paths that do not exist: {missing}"
