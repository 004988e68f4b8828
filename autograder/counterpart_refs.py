"""The student's own cells naming an exercise's course_lib counterpart: a flag the grader computes
from the notebook itself.

The recorder's evidence of a call into the counterpart (`thread_reference_calls`) is written in the
student's kernel, so a student can erase it from the record; what their cells import cannot be
erased. A cell that imports the counterpart function or class itself (`from course_lib.x import
kv_bytes_per_token`, or `import course_lib.x as m` / `from course_lib import x as m` and then
`m.kv_bytes_per_token`), or calls a function it looks up by a counterpart's name
(`namespace["kv_bytes_per_token"](...)`, `getattr(m, "kv_bytes_per_token")(...)`), is flagged for
review: a flag costs nothing by itself, and handing in the counterpart is refused by the checks.
"""
from __future__ import annotations

import ast

from .exercises import EXERCISES


def _counterparts() -> dict[str, set[str]]:
    """module -> the counterpart names defined there (course_lib's pieces the students rebuild)."""
    out: dict[str, set[str]] = {}
    for e in EXERCISES:
        if e.counterpart:
            module, name = e.counterpart.split(":")
            out.setdefault(module, set()).add(name)
    return out


def _looked_up_by_string(node) -> str | None:
    """The name in `namespace["name"](...)` or `getattr(x, "name")(...)`: a function fetched by its name and
    called (a copy of a module's functions, made by `runpy.run_path` or `exec` of its file, is a dict the
    function is fetched from). Only a call: `row["kv_bytes_per_token"] = ...` is an honest table's key."""
    if not isinstance(node, ast.Call):
        return None
    fetched = node.func
    if isinstance(fetched, ast.Subscript):
        key = fetched.slice
    elif (isinstance(fetched, ast.Call) and isinstance(fetched.func, ast.Name) and fetched.func.id == "getattr"
          and len(fetched.args) >= 2):
        key = fetched.args[1]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def counterpart_references(cells: list[tuple[int, str]], given: str = "") -> list[str]:
    """One line per (cell, counterpart) a student's cell imports or reaches through its module.
    `given`: the released notebook's code (an import the notebook itself writes, as notebook 07's
    `class StudentRecompute(ContinuousScheduler)` does, is not the student's)."""
    table = _counterparts()
    # Compound names only (`kv_bytes_per_token`, `BlockPool`): `row["answer"]` is an honest dict's key.
    every_name = {n for n in set().union(*table.values()) if "_" in n or n[1:] != n[1:].lower()}
    found: list[str] = []
    for index, source in cells:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError):
            continue  # (IPython syntax: the scan and the kernel judge those cells)
        aliases: dict[str, str] = {}  # local name -> counterpart module imported whole
        for node in ast.walk(tree):
            if (isinstance(node, (ast.Import, ast.ImportFrom)) and given
                    and (ast.get_source_segment(source, node) or "") in given):
                continue
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name in table.get(node.module, ()):
                        found.append(f"cell {index}: imports {node.module}.{alias.name}, the course_lib piece an "
                                     "exercise asks you to build")
                    elif f"{node.module}.{alias.name}" in table:  # `from course_lib.model import kv_footprint as k`
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in table:
                        aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                base = ast.unparse(node.value)
                module = aliases.get(base)
                if module and node.attr in table[module]:
                    found.append(f"cell {index}: uses {module}.{node.attr}, the course_lib piece an exercise asks "
                                 "you to build")
            name = _looked_up_by_string(node)
            if name in every_name:
                found.append(f"cell {index}: looks up {name!r} by its name, as course_lib's piece an exercise asks "
                             "you to build is called")
    return list(dict.fromkeys(found))
