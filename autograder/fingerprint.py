"""Copies of course_lib's implementations or of the answer key, flagged for review.

A copy flag is an accusation, so it is raised only for code the student wrote, only where two
independent solutions rarely coincide, and always with the evidence side by side.

Two fingerprints, both blind to renamed local variables, comments, docstrings and formatting:

- **source**: each function / method in the submission's code cells, parsed (`ast`), with local
  names replaced by their order of appearance, hashed; compared with the same hash of every
  function of course_lib and of the answer key (`autograder/reference/`, `autograder/controls/`)
  computed by the grader;
- **code**: the bytecode of the adapter the student handed in, taken at run time inside the
  sandbox (so `exec` of a copied source, or a class assembled at run time, still shows) and sent
  back as plain data; compared with the bytecode of the same functions compiled by the grader.

Not the student's, so never a copy: what a class inherits (a method resolved on the student's
class whose code object is course_lib's own: the notebook tells them to subclass
`SchedulerBase`), and what the notebook gives (every function of the released notebook: its
non-solution cells, and the solution cells' text outside `### BEGIN SOLUTION`, such as
notebook 4's launcher). A function the student defines with course_lib's code is still a copy.

Small functions are never evidence. Measured on honest variants written from the notebooks' text
and hints (tests/test_copy_flags.py keeps them): a function the notebook asks for coincides with
the answer key or course_lib up to 62 normalised AST nodes (`slot_mapping` as a loop with
`divmod`, `preempt` as hint 2 spells it, `paged_waste` with `math.ceil`), and 74 is within reach
(`page_keys`); a helper nobody asked for coincided up to 40 (course_lib's `_chunk`, described
by a hint). Hence two sizes, each at least 1.3 times the largest coincidence (the test holds
them to it): `MIN_NODES_ASKED` for a function whose name the notebook's answer cells define,
`MIN_NODES` for any other. course_lib's `SchedulerBase._admit` (68) pasted into a class counts.
A match is a flag with its evidence, not a verdict: an instructor decides.
"""
from __future__ import annotations

import ast
import dis
import functools
import hashlib
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOWN_PACKAGES = ("course_lib", "autograder/reference", "autograder/controls")
MIN_NODES = 60  # any function smaller than this (normalised AST nodes) is not evidence
MIN_NODES_ASKED = 100  # the same for a function the notebook asks for: its hints nearly dictate a short one
# Functions below this many bytecode instructions are not sent back by the sandbox: far below
# MIN_NODES, the grader would discard them anyway (`return self.running[-1]` is 6 instructions).
MIN_INSTRUCTIONS = 12
MAX_CODE_CHARS = 4000  # each side of the evidence
MAX_COPIES = 30
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


# ---------------------------------------------------------------------------------------------
# One function, as both fingerprints see it
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


@dataclass(frozen=True)
class Function:
    where: str  # "cell 7: slot_mapping", "course_lib.kv.slots.slot_mapping"
    name: str  # the bare name
    source: str  # its text (capped)
    nodes: int  # size of its normalised AST
    source_hash: str
    code_hash: str | None  # its bytecode's, when its text compiles


def _source_hash(node) -> tuple[str, int]:
    clone = _Normalise().visit(ast.parse(ast.unparse(node)).body[0])
    size = sum(1 for _ in ast.walk(clone))
    return hashlib.sha256(ast.dump(clone, annotate_fields=False).encode()).hexdigest()[:24], size


def _code_objects(code: types.CodeType):
    """Every named code object compiled inside `code`, at any depth (lambdas and comprehensions are
    part of the function that holds them)."""
    stack = [code]
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, types.CodeType):
                if not const.co_name.startswith("<"):
                    yield const
                stack.append(const)


def functions_in(source: str, where: str) -> list[Function]:
    """Every function / method defined in `source` (a module, a cell), nested ones included."""
    # The student's text is hostile: whatever parsing or compiling it raises, it is only evidence.
    try:
        tree = ast.parse(source)
    except Exception:  # noqa: BLE001 - SyntaxError, RecursionError, MemoryError, too many digits...
        return []
    try:
        codes = {(c.co_name, c.co_firstlineno): c for c in _code_objects(compile(source, "<fingerprint>", "exec"))}
    except Exception:  # noqa: BLE001 - (the source fingerprint still counts)
        codes = {}
    lines = source.splitlines(keepends=True)
    out: list[Function] = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                code = codes.get((child.name, first)) or codes.get((child.name, child.lineno))
                try:
                    source_hash, nodes = _source_hash(child)
                except Exception:  # noqa: BLE001 - a tree too deep to unparse is not evidence
                    continue
                text = textwrap.dedent("".join(lines[first - 1:child.end_lineno or child.lineno]))
                out.append(Function(f"{where}{prefix}{child.name}", child.name, text[:MAX_CODE_CHARS], nodes,
                                    source_hash, _code_hash(code) if code is not None else None))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


# ---------------------------------------------------------------------------------------------
# What a copy would match: course_lib and the answer key
# ---------------------------------------------------------------------------------------------


@dataclass
class Known:
    by_source: dict[str, Function] = field(default_factory=dict)
    by_code: dict[str, Function] = field(default_factory=dict)


def matched_name(function: Function) -> str:
    """What the instructor is told a copy matches: course_lib's function by name, or the answer key."""
    return function.where if function.where.startswith("course_lib") else "answer key"


@functools.lru_cache(maxsize=1)
def known() -> Known:
    """course_lib's functions and the answer key's, computed once per grader (course_lib first)."""
    table = Known()
    for package in KNOWN_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for f in functions_in(text, f"{module}."):
                table.by_source.setdefault(f.source_hash, f)
                if f.code_hash:
                    table.by_code.setdefault(f.code_hash, f)
    return table


# ---------------------------------------------------------------------------------------------
# What the notebook gives, and what it asks for
# ---------------------------------------------------------------------------------------------


@dataclass
class Given:
    """From the source notebook: the released notebook's functions (scaffolding: given, not
    written), the names the answer cells ask for, and the released code cells' text."""
    source_hashes: set[str] = field(default_factory=set)
    code_hashes: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)
    cells: list[str] = field(default_factory=list)

    def min_nodes(self, name: str) -> int:
        return MIN_NODES_ASKED if name in self.asked else MIN_NODES


def python_lines(source: str) -> str:
    """A cell without IPython magics / shell lines (blanked, so line numbers stay)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _asked_names(source: str) -> set[str]:
    """Functions of an answer cell that hold a solution region, or that the region defines."""
    try:
        tree = ast.parse(python_lines(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    lines = source.splitlines()
    begins = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(_MARKERS[0])]
    ends = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(_MARKERS[1])]
    regions = list(zip(begins, ends))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = (node.lineno, node.end_lineno or node.lineno)
            if any(span[0] <= b <= span[1] or b <= span[0] <= e for b, e in regions):
                names.add(node.name)
    return names


def given_by(source_nb) -> Given:
    """What the notebook gives its students (nbgrader's release of `source_nb`) and asks of them."""
    from .submissions import is_solution_cell, released_submission

    given = Given()
    for cell in source_nb.cells:
        if is_solution_cell(cell):
            given.asked |= _asked_names(cell.get("source", ""))
    for cell in released_submission(source_nb).cells:
        if cell.get("cell_type") != "code":
            continue
        given.cells.append(cell.get("source", ""))
        for f in functions_in(python_lines(cell.get("source", "")), ""):
            given.source_hashes.add(f.source_hash)
            if f.code_hash:
                given.code_hashes.add(f.code_hash)
    return given


# ---------------------------------------------------------------------------------------------
# Copies: the flag line and the evidence side by side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    flag: str  # one line for entry["flags"] and summary.csv
    where: str
    student_code: str
    matched: Function

    def evidence(self) -> dict:
        # course_lib ships with the course: its code may sit beside the student's. The answer key's
        # never leaves the instructor's side (the feedback page is the student's): its place is named.
        public = self.matched.where.startswith("course_lib")
        matched_code = self.matched.source[:MAX_CODE_CHARS] if public else (
            f"# {self.matched.where}: the answer key's code is not shown in feedback; the instructor finds it "
            "in autograder/reference/ or autograder/controls/")
        return {"where": self.where, "student_code": self.student_code[:MAX_CODE_CHARS],
                "matched": matched_name(self.matched), "matched_code": matched_code}


def _label(function: Function) -> str:
    return function.where if function.where.startswith("course_lib") else f"the answer key ({function.where})"


def student_functions(cells: list[tuple[int, str]]) -> list[Function]:
    return [f for index, source in cells for f in functions_in(python_lines(source), f"cell {index}: ")]


def source_copies(cells: list[tuple[int, str]], given: Given) -> list[Copy]:
    """The submission's functions whose normalised source is course_lib's or the answer key's."""
    table, found = known(), []
    for f in student_functions(cells):
        match = table.by_source.get(f.source_hash)
        if match is None or f.source_hash in given.source_hashes or match.nodes < given.min_nodes(f.name):
            continue
        found.append(Copy(f"{f.where} has the same code as {_label(match)} (normalised source)", f.where,
                          f.source, match))
    return found[:MAX_COPIES]


def code_copies(records, cells: list[tuple[int, str]], given: Given) -> list[Copy]:
    """The recorded adapters' functions whose bytecode is course_lib's or the answer key's: one
    copy per (check, function), whatever the number of seeds it was recorded for."""
    table = known()
    mine = {f.code_hash: f for f in student_functions(cells) if f.code_hash}
    seeds: dict[tuple[str, str, str], list[str]] = {}
    for rec in records if isinstance(records, list) else []:
        items = rec.get("code") if isinstance(rec, dict) else None
        for item in items if isinstance(items, list) else []:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
                continue
            qualname, code_hash = str(item[0])[:100], item[1]
            match = table.by_code.get(code_hash)
            if match is None or code_hash in given.code_hashes \
                    or match.nodes < given.min_nodes(qualname.rsplit(".", 1)[-1]):
                continue
            key = (str(rec.get("exercise"))[:100], qualname, code_hash)
            seeds.setdefault(key, []).append(str(rec.get("seed"))[:20])
    found = []
    for (exercise, qualname, code_hash), seed_list in seeds.items():
        match = table.by_code[code_hash]
        own = mine.get(code_hash)
        # The name shown is the student's own function's (from their cells) or the matched one's: never
        # the record's text, which the student's code can write (a channel out of the sandbox).
        name = own.where.split(": ", 1)[-1] if own is not None else f"a function built at run time like {match.name}"
        student_code = own.source if own is not None else (
            f"# {match.name}: no cell of the notebook defines this code as written; it was built at run time "
            "(exec, compile, a class assembled in code)")
        where = f"check_{exercise}(seed={', '.join(dict.fromkeys(seed_list))}): {name}"
        found.append(Copy(f"{where} runs the same bytecode as {_label(match)}", where, student_code, match))
    return found[:MAX_COPIES]


# ---------------------------------------------------------------------------------------------
# Code (bytecode) fingerprints, taken in the sandbox
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


def _course_lib_holds(fn) -> bool:
    """True when `fn`'s code object is the one course_lib's own module holds under `fn`'s qualified
    name: inherited (or handed over) from course_lib, not written by the student. Identity, not
    equality: a function the student defines with course_lib's code (pasted, exec'd) is a new code
    object, and stays a copy."""
    code = getattr(fn, "__code__", None)
    module_name = getattr(fn, "__module__", None)
    if not isinstance(code, types.CodeType) or not isinstance(module_name, str) \
            or not (module_name == "course_lib" or module_name.startswith("course_lib.")):
        return False
    obj = sys.modules.get(module_name)
    for part in str(getattr(fn, "__qualname__", "")).split("."):
        namespace = getattr(obj, "__dict__", None)
        obj = namespace.get(part) if isinstance(namespace, (dict, types.MappingProxyType)) else None
        if obj is None:
            return False
    candidates = [obj, getattr(obj, "__func__", None), getattr(obj, "fget", None), getattr(obj, "fset", None)]
    return any(getattr(c, "__code__", None) is code for c in candidates if c is not None)


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
        if not _course_lib_holds(obj):
            yield getattr(obj, "__qualname__", "?"), code
        return
    if isinstance(obj, type) and depth == 0:
        # What the class resolves each name to (the first class of the MRO that defines it): an
        # overridden base method is not part of the class, an inherited one is course_lib's.
        seen = set()
        for klass in obj.__mro__:
            if klass is object:
                continue
            for attr, value in list(vars(klass).items()):
                if attr not in seen:
                    seen.add(attr)
                    yield from _codes_of(value, depth + 1)


def code_fingerprints(obj) -> list[list[str]]:
    """[[qualified name, hash], ...] for the functions behind `obj` (a function, a class's methods)
    that the student wrote: course_lib's own code objects (inherited methods) are left out."""
    out = []
    for qualname, code in _codes_of(obj):
        if sum(1 for _ in dis.get_instructions(code)) >= MIN_INSTRUCTIONS:
            out.append([str(qualname)[:200], _code_hash(code)])
        if len(out) >= 200:
            break
    return out
