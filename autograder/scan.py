"""Scan the student's code: what zeroes a notebook (references to the grader, builtins, the import
system, frames: `scan_source`) and what an instructor may want to look at, at no cost (`review_flags`)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
import unicodedata


_FORBIDDEN_NAMES = {
    "autograder": "refers to the autograder",
    "builtins": "modifies builtins",
    "__builtins__": "modifies builtins",
    "importlib": "uses the import machinery (importlib)",
    "ctypes": "uses ctypes",
    "__code__": "rewrites function code (__code__)",
    "__globals__": "reaches into function globals (__globals__)",
    "__closure__": "reaches into closures (__closure__)",
    "f_locals": "edits stack frames",
    "f_globals": "edits stack frames",
    "f_back": "walks stack frames",
    "_getframe": "walks stack frames",
    "currentframe": "walks stack frames",
    "setprofile": "installs a profiler hook",
    "settrace": "installs a trace hook",
    "meta_path": "changes the import system",
    "path_hooks": "changes the import system",
    "get_ipython": "reaches into IPython",
    "InteractiveShell": "reaches into IPython",
    "run_cell": "reaches into IPython",
    "showtraceback": "reaches into IPython",
    "set_custom_exc": "reaches into IPython",
    "get_objects": "searches the heap (gc)",
    "get_referrers": "searches the heap (gc)",
}


def _code_lines(source: str) -> str:
    """The cell without IPython magics / shell lines (they are not Python)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def scan_source(source: str) -> list[str]:
    """What in this code touches the grader or the interpreter's internals ('line N: why')."""
    code = _code_lines(source)
    findings = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
        for lineno, line in enumerate(code.splitlines(), 1):
            stripped = line.split("#", 1)[0]
            for name in _FORBIDDEN_NAMES:
                if re.search(rf"\b{re.escape(name)}\b", stripped):
                    findings.append(f"line {lineno}: {_FORBIDDEN_NAMES[name]} (`{line.strip()[:80]}`)")
        return findings
    names = [t for t in tokens if t.type == tokenize.NAME]
    # Python reads identifiers NFKC-normalised (a full-width letter is the plain letter): so does the scan.
    plain = [unicodedata.normalize("NFKC", t.string) for t in names]
    for i, tok in enumerate(names):
        why = _FORBIDDEN_NAMES.get(plain[i])
        if plain[i] == "modules" and i > 0 and plain[i - 1] == "sys":
            why = "changes sys.modules"
        if why:
            findings.append(f"line {tok.start[0]}: {why} (`{tok.line.strip()[:80]}`)")
    tree = _parsed(code)
    if tree is not None:
        findings += _scan_course_lib_assignments(tree)
        findings += _scan_sys_aliases(tree)
    return list(dict.fromkeys(findings))


def _parsed(code: str):
    """The cell's syntax tree, or None where Python cannot read it (the tokens' scan judges those)."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _scan_sys_aliases(tree) -> list[str]:
    """`import sys as s` then `s.modules`: `sys.modules` under another name."""
    aliases = {a.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "sys" and a.asname}
    return [f"line {node.lineno}: changes sys.modules (`{ast.unparse(node)[:80]}`)" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
            and node.value.id in aliases]


def _scan_course_lib_assignments(tree) -> list[str]:
    """`BlockPool.allocate = ...`, `setattr(course_lib.x, ...)`: patching the course's own code."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "course_lib"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_lib":
            roots |= {a.asname or a.name for a in node.names}
    if not roots:
        return []

    def root_of(expr):
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    findings = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and root_of(target) in roots:
                findings.append(f"line {node.lineno}: modifies course_lib ({ast.unparse(target)})")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.args and root_of(node.args[0]) in roots):
            findings.append(f"line {node.lineno}: modifies course_lib ({ast.unparse(node)[:80]})")
    return findings


_REVIEW_NAMES = {"exec": "runs code from a string (exec)", "eval": "evaluates a string (eval)",
                 "compile": "compiles code at run time (compile)", "b64decode": "decodes base64",
                 "__import__": "imports by name (__import__)", "getsource": "reads source code (inspect.getsource)",
                 "Thread": "starts a thread", "Process": "starts a process", "fork": "forks", "Popen": "runs a program",
                 "system": "runs a shell command", "mkdtemp": "makes a temporary folder (tempfile)",
                 "TemporaryDirectory": "makes a temporary folder (tempfile)",
                 "NamedTemporaryFile": "writes a temporary file (tempfile)"}


def review_flags(source: str) -> list[str]:
    """Things in the student's code an instructor may want to look at (not penalised)."""
    flags = []
    for lineno, line in enumerate(source.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) and not stripped.startswith(("%matplotlib", "%time", "%timeit", "%%time")):
            flags.append(f"line {lineno}: IPython magic or shell line (`{stripped[:60]}`)")
    code = _code_lines(source)
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
    for tok in tokens:
        name = unicodedata.normalize("NFKC", tok.string)
        if name != tok.string:
            flags.append(f"line {tok.start[0]}: identifier {tok.string!r} is written with look-alike characters")
        if name in _REVIEW_NAMES:
            flags.append(f"line {tok.start[0]}: {_REVIEW_NAMES[name]} (`{tok.line.strip()[:80]}`)")
    tree = _parsed(code)
    if tree is not None:
        flags += _refused_names_in_strings(tree) + _import_paths(tree)
    return list(dict.fromkeys(flags))[:20]


def _import_paths(tree) -> list[str]:
    """`sys.path`: a module path of one's own. A copy of course_lib's file imported from elsewhere is a module
    the trip wires cannot tell from an honest one (docs/grading.md, "What remains possible")."""
    return [f"line {node.lineno}: changes where imports are found (`{ast.unparse(node)[:80]}`)"
            for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys"]


def _folded(node) -> str | None:
    """The string `node` builds from string constants alone (`"a" + "b"`, `"".join(["a", "b"])`,
    `"ba"[::-1]`), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        return left + right if left is not None and right is not None else None
    if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.lower is None
            and node.slice.upper is None and isinstance(node.slice.step, ast.UnaryOp)
            and isinstance(node.slice.step.op, ast.USub) and isinstance(node.slice.step.operand, ast.Constant)
            and node.slice.step.operand.value == 1):
        inner = _folded(node.value)
        return inner[::-1] if inner is not None else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and isinstance(node.func.value, ast.Constant) and node.func.value.value == ""
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
        parts = [_folded(e) for e in node.args[0].elts]
        return "".join(parts) if all(part is not None for part in parts) else None
    return None


# Where a whole string names what it reaches: an attribute's name (their second argument), and nothing
# else. (A dict key or a printed word "modules" is ordinary; `getattr(f, "__code__")` is `f.__code__`
# written round the scan.)
_TAKES_A_NAME = {"getattr", "setattr", "hasattr", "delattr"}


def _refused_names_in_strings(tree) -> list[str]:
    """A name the scan refuses, built from strings (`"auto" + "grader"`, `"mod" + "ules"`, `"__edoc__"[::-1]`),
    given as an attribute's name (`getattr(f, "__code__")`), or a dotted path into the autograder
    (`mods["autograder.checks.nb07"]`): written as a name it would have zeroed the notebook, so a string is a
    way round the scan worth a look."""
    nodes = list(ast.walk(tree))
    texts = {id(node): _folded(node) for node in nodes}
    whole = {id(node.args[1]) for node in nodes  # the string constants that stand where an attribute's name does
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TAKES_A_NAME
             and len(node.args) > 1}
    inside = {id(child) for node in nodes if texts[id(node)] is not None and not isinstance(node, ast.Constant)
              for child in ast.walk(node) if child is not node}
    flags = []
    for node in nodes:
        text = texts[id(node)]
        if text is None or id(node) in inside:
            continue  # (a piece of a larger string is judged with it)
        built = not isinstance(node, ast.Constant)
        if not built and not (_DOTTED.fullmatch(text) and (id(node) in whole or text.startswith("autograder."))):
            continue
        hit = sorted(w for w in set(text.split(".")) if w in _FORBIDDEN_NAMES or w == "modules")
        if hit:
            how = "out of pieces of strings" if built else "in a string"
            flags.append(f"line {node.lineno}: spells {hit[0]!r} {how} (`{ast.unparse(node)[:80]}`)")
    return flags


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
