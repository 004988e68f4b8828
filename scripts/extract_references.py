"""Generate the autograder's reference solutions from the instructor notebooks' solution cells.

`autograder/reference/<module>.py` is *generated*: for each notebook in solutions/, it holds
the notebook's imports (top-level import statements of every code cell that is not a graded
test) followed by every such cell that only defines things (imports, functions, classes,
constants): the solution cells and the helpers they use, in notebook order. Cells that compute
(load a model, run an engine, plot) are left out, so importing a reference is cheap.
Imports of the autograder itself are dropped (a reference must paste into a notebook as is).

    python scripts/extract_references.py            # rewrite autograder/reference/*.py
    python scripts/extract_references.py --check    # exit 1 if any is out of date
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
REFERENCE = ROOT / "autograder" / "reference"
HEADER = ('"""Notebook {title}: reference solutions. GENERATED from {source} by\n'
          'scripts/extract_references.py: do not edit; edit the notebook\'s solution cells."""\n')
DEFINING = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _code(cell) -> str:
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    # IPython magics and shell escapes are not Python; the markers are nbgrader's.
    keep = [line for line in source.splitlines()
            if not line.lstrip().startswith(("%", "!")) and line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
    return "\n".join(keep)


def _is_graded_test(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return bool(meta.get("grade")) and not meta.get("solution")


def _is_autograder_import(node) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "autograder"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "autograder" for a in node.names)


def _is_constant_assign(node) -> bool:
    """`NAME = <literal>` (a constant the solutions may use), nothing computed."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def _defines_only(tree: ast.Module) -> bool:
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return bool(body) and all(isinstance(n, DEFINING) or _is_constant_assign(n) for n in body)


def _bound_names(import_source: str) -> set[str]:
    node = ast.parse(import_source).body[0]
    return {(a.asname or a.name).split(".")[0] for a in node.names}


def _names_used(source: str) -> set[str]:
    """Every name the definitions read (so only the imports they need are kept)."""
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}


def _with_decorators(code: str, node) -> str:
    """The node's source, its decorators included (ast's segment of a def starts at `def`: a
    `@triton.jit` or `@dataclass` would be lost)."""
    decorators = getattr(node, "decorator_list", [])
    if not decorators:
        return ast.get_source_segment(code, node, padded=False)
    lines = code.splitlines()
    return "\n".join(lines[decorators[0].lineno - 1:node.end_lineno])


def reference_source(notebook: Path) -> str:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    imports: list[str] = []
    definitions: list[str] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or _is_graded_test(cell):
            continue
        code = _code(cell)
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            raise SystemExit(f"{notebook}: a code cell does not parse ({e}); fix the notebook")
        if _defines_only(tree):
            kept = [n for n in tree.body if not _is_autograder_import(n)]
            definitions.append("\n".join(_with_decorators(code, n) for n in kept
                                         if not isinstance(n, (ast.Import, ast.ImportFrom))))
            imports += [ast.get_source_segment(code, n) for n in kept if isinstance(n, (ast.Import, ast.ImportFrom))]
        else:
            imports += [ast.get_source_segment(code, n) for n in tree.body
                        if isinstance(n, (ast.Import, ast.ImportFrom)) and not _is_autograder_import(n)]
    used = _names_used("\n".join(definitions))
    unique_imports = [i for i in dict.fromkeys(i for i in imports if i) if _bound_names(i) & used]
    title = notebook.stem.replace("_", " ", 1)
    parts = [HEADER.format(title=title, source=notebook.relative_to(ROOT).as_posix()), "\n".join(unique_imports)]
    parts += [d for d in definitions if d.strip()]
    return "\n\n\n".join(p.rstrip() for p in parts) + "\n"


def _is_graded_notebook(notebook: Path) -> bool:
    """Only notebooks with solution cells have a reference module."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return any((c.get("metadata", {}).get("nbgrader", {}) or {}).get("solution") for c in nb["cells"])


def targets() -> dict[Path, str]:
    out = {}
    for notebook in sorted(SOLUTIONS.glob("*/*.ipynb")):
        if ".ipynb_checkpoints" in notebook.parts or not _is_graded_notebook(notebook):
            continue
        out[REFERENCE / f"nb{notebook.stem}.py"] = reference_source(notebook)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report references that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in targets().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
