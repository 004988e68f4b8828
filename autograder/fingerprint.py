"""Copies of course_lib's implementations or of the answer key, flagged for review.

Two fingerprints, both blind to renamed local variables, comments, docstrings and formatting:

- **source**: each function / method in the submission's code cells, parsed (`ast`), with local
  names replaced by their order of appearance, hashed; compared with the same hash of every
  function of course_lib and of `autograder/reference/` (the answer key) computed by the grader;
- **code**: the bytecode of the adapter the student handed in, taken at run time inside the
  sandbox (so `exec` of a copied source, or a class assembled at run time, still shows) and sent
  back as plain data; compared with the bytecode of the same functions compiled by the grader.

Tiny functions (a few statements) are ignored: two honest students write the same one-liners.
A match is a flag with its evidence, not a verdict: an instructor decides.
"""
from __future__ import annotations

import ast
import dis
import functools
import hashlib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_NODES = 40  # a function smaller than this (AST nodes) is too common to mean anything
# A function of fewer bytecode instructions than this (a one-line formula: `kv_bytes_per_token` is
# 17) is what two honest students write alike: its bytecode proves nothing.
MIN_INSTRUCTIONS = 30


def _big_enough(code: types.CodeType) -> bool:
    return sum(1 for _ in dis.get_instructions(code)) >= MIN_INSTRUCTIONS


# ---------------------------------------------------------------------------------------------
# Source (AST) fingerprints
# ---------------------------------------------------------------------------------------------


class _Normalise(ast.NodeTransformer):
    """Locals and arguments renamed v0, v1, ... in order of appearance; docstrings dropped."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_arg(self, node):
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node

    def visit_Name(self, node):
        if node.id in self.names or isinstance(node.ctx, ast.Store):
            node.id = self._rename(node.id)
        return node

    def _strip_doc(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]

    def visit_FunctionDef(self, node):
        self._strip_doc(node)
        node.name = "f"
        node.returns = None
        node.decorator_list = []
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def _function_hash(node) -> tuple[str, int] | None:
    size = sum(1 for _ in ast.walk(node))
    if size < MIN_NODES:
        return None
    clone = ast.parse(ast.unparse(node)).body[0]
    clone = _Normalise().visit(clone)
    return hashlib.sha256(ast.dump(clone, annotate_fields=False).encode()).hexdigest()[:24], size


def source_functions(source: str, where: str) -> dict[str, str]:
    """hash -> 'where: qualified name' for every function / method in `source` big enough to count."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    out: dict[str, str] = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                h = _function_hash(child)
                if h:
                    out.setdefault(h[0], f"{where}: {prefix}{child.name}")
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


@functools.lru_cache(maxsize=1)
def known_sources() -> dict[str, str]:
    """Fingerprints of course_lib's functions and the answer key's (computed once per grader)."""
    known: dict[str, str] = {}
    for package in ("course_lib", "autograder/reference", "autograder/controls"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            try:
                known.update({h: w for h, w in source_functions(path.read_text(encoding="utf-8"), rel).items()
                              if h not in known})
            except (OSError, UnicodeDecodeError):
                continue
    return known


def source_matches(cells: list[tuple[int, str]]) -> list[str]:
    """Evidence lines for the submission's functions that match course_lib / the answer key."""
    known = known_sources()
    found = []
    for index, source in cells:
        for h, where in source_functions(source, f"cell {index}").items():
            if h in known:
                found.append(f"{where} has the same code as {known[h]} (normalised source)")
    return found


# ---------------------------------------------------------------------------------------------
# Code (bytecode) fingerprints
# ---------------------------------------------------------------------------------------------


_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)


def _instructions(code: types.CodeType) -> list[str]:
    """The code's instructions, blind to what depends on where it was compiled: method loads (the
    compiler writes `torch.tensor(...)` as LOAD_METHOD or as LOAD_GLOBAL NULL + LOAD_ATTR depending
    on context), jump offsets (cache sizes differ with them) and nested code objects' addresses."""
    out = []
    for ins in dis.get_instructions(code):
        name = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if ins.opcode in _JUMPS:
            arg = ""
        elif isinstance(ins.argval, types.CodeType):
            arg = _code_hash(ins.argval)
        else:
            arg = ins.argrepr.replace("NULL + ", "").replace("NULL|self + ", "")
        out.append(f"{name} {arg}")
    return out


def _code_hash(code: types.CodeType) -> str:
    docstring = code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else None
    parts = [repr(code.co_argcount)]
    for line in _instructions(code):
        if docstring is not None and line == f"LOAD_CONST {docstring!r}":
            continue
        parts.append(line)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _codes_of(obj, depth=0):
    obj = getattr(obj, "__func__", obj)
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset):
            if f is not None:
                yield from _codes_of(f, depth + 1)
        return
    if isinstance(obj, (staticmethod, classmethod)):
        yield from _codes_of(obj.__func__, depth + 1)
        return
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        yield getattr(obj, "__qualname__", "?"), code
        return
    if isinstance(obj, type) and depth == 0:
        for klass in obj.__mro__:
            if klass is object:
                continue
            for attr, value in list(vars(klass).items()):
                yield from _codes_of(value, depth + 1)


def code_fingerprints(obj) -> list[list[str]]:
    """[[qualified name, hash], ...] for the functions behind `obj` (a function, a class's methods)."""
    out = []
    for qualname, code in _codes_of(obj):
        if _big_enough(code):
            out.append([str(qualname)[:200], _code_hash(code)])
        if len(out) >= 200:
            break
    return out


@functools.lru_cache(maxsize=1)
def known_code() -> dict[str, str]:
    """hash -> 'module.qualname' of every function compiled from course_lib's and the answer key's files."""
    known: dict[str, str] = {}
    for package in ("course_lib", "autograder/reference", "autograder/controls"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            try:
                module_code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            stack = [(module_code, "")]
            while stack:
                code, prefix = stack.pop()
                for const in code.co_consts:
                    if isinstance(const, types.CodeType):
                        name = f"{prefix}{const.co_name}"
                        if _big_enough(const):
                            known.setdefault(_code_hash(const), f"{rel}.{name}")
                        stack.append((const, f"{name}."))
    return known


def code_matches(fingerprints) -> list[str]:
    """Evidence lines for recorded adapter code that matches course_lib / the answer key."""
    known = known_code()
    found = []
    for item in fingerprints if isinstance(fingerprints, list) else []:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[1], str) and item[1] in known:
            found.append(f"{str(item[0])[:100]} runs the same bytecode as {known[item[1]]}")
    return found
