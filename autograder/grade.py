"""`python -m autograder grade NOTEBOOK... --json PATH`: grade submissions without nbgrader's database.

For each submitted notebook (docs/grading.md has the whole story):

1. **Find its source** in `--source-dir` (the instructor's nbgrader source, e.g. `solutions/`).
2. **Restore** what the student may not change (nbgrader's autograde semantics, keyed by
   `metadata.nbgrader.grade_id`): graded test cells and read-only cells from the source, hidden
   tests included; deleted ones put back; points and metadata always from the source.
3. **Scan** the student's code (`scan_source`: evidence that zeroes the notebook) and fingerprint
   it (`autograder.fingerprint`: copies, flagged for review).
4. **Execute** in a sandbox of its own (`autograder.sandbox`, `autograder.sandbox_exec`): a fresh
   kernel, cell by cell, per-cell timeout, a time budget, restarts after a kernel dies, outputs
   capped; the in-kernel guard (`autograder.integrity`) wraps every test cell, and every check
   call is recorded as plain data (`autograder.record`).
5. **Decide in the grader**: each test cell's checks are replayed from the record in this process
   (`autograder.verdict`, `autograder.replay`); a cell earns its points only if it passed in the
   kernel (nbgrader's rule plus the guard's marker) AND every check passes in replay.

Writes `{"score", "max_score", "notebooks": [{"path", "score", "max_score", "cells": [...]}]}`;
each cell has `cell_id`, `grade_id`, `score`, `max_score`, `passed`, `status`, `feedback`.
Many submissions: `autograder.batch` (workers, one JSON each, summary.csv, resume).
"""
from __future__ import annotations

import asyncio
import copy
import html
import io
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import tokenize
import unicodedata
from pathlib import Path

import nbformat

DEFAULT_TIMEOUT = 60
SETUP_TIMEOUT = 300  # the setup cell imports torch and the checks: slow on a busy machine
MAX_KERNEL_RESTARTS = 3
PROBE_TIMEOUT = 15
ROOT = Path(__file__).resolve().parent.parent
GUARDED_PACKAGES = (ROOT / "autograder", ROOT / "course_lib")


# ---------------------------------------------------------------------------------------------
# nbgrader metadata
# ---------------------------------------------------------------------------------------------


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id(cell) -> str | None:
    return _nbg(cell).get("grade_id")


def is_test_cell(cell) -> bool:
    """An autograded test cell: graded, not an answer."""
    m = _nbg(cell)
    return bool(m.get("grade")) and not m.get("solution") and cell.get("cell_type") == "code"


def is_manual_cell(cell) -> bool:
    m = _nbg(cell)
    return bool(m.get("grade")) and (bool(m.get("solution")) or cell.get("cell_type") != "code")


def is_protected(cell) -> bool:
    """Restored from the source: tests and read-only cells."""
    m = _nbg(cell)
    return bool(m.get("locked")) or is_test_cell(cell)


def points(cell) -> float:
    try:
        return float(_nbg(cell).get("points", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


def _read(path: Path):
    with open(path, encoding="utf-8") as f:
        return nbformat.read(f, as_version=4)


def source_index(source_dir: Path) -> dict[str, Path]:
    """'<assignment>/<name>.ipynb' and '<name>.ipynb' -> source path (checkpoints ignored)."""
    index: dict[str, Path] = {}
    if not source_dir.is_dir():
        return index
    for path in sorted(source_dir.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(source_dir)
        index.setdefault(str(rel.parent / rel.name) if rel.parent != Path(".") else rel.name, path)
        index.setdefault(path.name, path)
    return index


def find_source(submission: Path, index: dict[str, Path]) -> Path | None:
    """The source notebook of a submission: same assignment folder and file name; else the same
    file name; else the source whose name the submission's name contains (longest wins), so that
    `alice_03_paged_kv.ipynb` still finds `03_paged_kv/03_paged_kv.ipynb`."""
    key = f"{submission.parent.name}/{submission.name}"
    if key in index:
        return index[key]
    if submission.name in index:
        return index[submission.name]
    stem = submission.stem
    candidates = [p for p in set(index.values()) if p.stem in stem or p.parent.name in stem]
    if candidates:
        return max(candidates, key=lambda p: (len(p.stem), str(p)))
    return None


# ---------------------------------------------------------------------------------------------
# Restore protected cells
# ---------------------------------------------------------------------------------------------


def _fresh(cell):
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    return cell


HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def hidden_line_ranges(source: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers of each hidden-tests block, markers included; an
    unterminated block runs to the end. One pass over the lines: linear in the cell's size."""
    ranges, start = [], None
    lines = source.split("\n")
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if start is None and stripped.startswith(HIDDEN_BEGIN):
            start = number
        elif start is not None and stripped.startswith(HIDDEN_END):
            ranges.append((start, number))
            start = None
    if start is not None:
        ranges.append((start, len(lines)))
    return ranges


def without_hidden(source: str) -> str:
    """The cell as the release shows it (hidden-tests blocks removed)."""
    ranges = hidden_line_ranges(source)
    if not ranges:
        return source
    lines = source.split("\n")
    hidden = set()
    for first, last in ranges:
        hidden.update(range(first, last + 1))
    return "\n".join(line for number, line in enumerate(lines, 1) if number not in hidden)


def hidden_lines(source: str) -> list[str]:
    lines = source.split("\n")
    out = []
    for first, last in hidden_line_ranges(source):
        out += [lines[i - 1].strip() for i in range(first + 1, last) if len(lines[i - 1].strip()) >= 8]
    return out


def _visible(source: str) -> str:
    """A test cell as the release shows it: hidden tests removed, whitespace normalised."""
    return "\n".join(line.rstrip() for line in without_hidden(source).strip().splitlines() if line.strip())


def assemble(submission, source) -> tuple[object, list[str]]:
    """The notebook to execute: the submission, with every protected cell taken from the source
    (and put back if deleted), and nbgrader metadata (points!) always from the source."""
    notes: list[str] = []
    src_cells = {grade_id(c): c for c in source.cells if grade_id(c)}
    order = [grade_id(c) for c in source.cells if grade_id(c)]
    out = []
    seen = set()
    for cell in submission.cells:
        cell = _fresh(cell)
        cell.setdefault("metadata", {})
        gid = grade_id(cell)
        if gid and (gid in seen or gid not in src_cells):
            notes.append(f"cell with grade_id {gid!r} is not in the source (or duplicated): graded as a plain cell")
            cell["metadata"].pop("nbgrader", None)
            gid = None
        if gid:
            seen.add(gid)
            src = src_cells[gid]
            if is_protected(src):
                restored = _fresh(src)
                if _visible(restored.get("source", "")) != _visible(cell.get("source", "")):
                    notes.append(f"restored {gid!r} from the source (it had been edited)")
                cell = restored
            else:
                cell["metadata"]["nbgrader"] = copy.deepcopy(_nbg(src))
                cell["cell_type"] = src.get("cell_type", cell.get("cell_type"))
            cell["metadata"]["autograder"] = {"origin": "source" if is_protected(src) else "submission"}
        else:
            cell["metadata"]["autograder"] = {"origin": "submission"}
        out.append(cell)
    # Protected cells the student deleted go back after the nearest earlier source cell present.
    for i, gid in enumerate(order):
        if gid in seen or not is_protected(src_cells[gid]):
            continue
        position = 0
        for earlier in reversed(order[:i]):
            idx = next((j for j, c in enumerate(out) if grade_id(c) == earlier), None)
            if idx is not None:
                position = idx + 1
                break
        cell = _fresh(src_cells[gid])
        cell.setdefault("metadata", {})["autograder"] = {"origin": "source"}
        out.insert(position, cell)
        seen.add(gid)
        notes.append(f"restored {gid!r} from the source (it had been deleted)")
    nb = copy.deepcopy(source)
    nb.cells = out
    nb.metadata = copy.deepcopy(source.metadata)
    return nb, notes


# ---------------------------------------------------------------------------------------------
# Scan the student's code
# ---------------------------------------------------------------------------------------------

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
    findings += _scan_course_lib_assignments(code)
    return list(dict.fromkeys(findings))


def _scan_course_lib_assignments(code: str) -> list[str]:
    """`BlockPool.allocate = ...`, `setattr(course_lib.x, ...)`: patching the course's own code."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
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


# ---------------------------------------------------------------------------------------------
# Files on disk: kernels import a staged copy of the packages, never the repository's files
# ---------------------------------------------------------------------------------------------


class Stage:
    """A private copy of `autograder/` and `course_lib/` that one notebook's kernel imports (it goes
    first on its PYTHONPATH). Student code that rewrites a check on disk rewrites only this copy:
    the change is detected after the notebook and reported as an integrity violation. The
    repository's own files are never written, and no two notebooks share a copy."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="autograde-stage-"))
        for package in GUARDED_PACKAGES:
            shutil.copytree(package, self.dir / package.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        self.files = self._read()

    def _read(self) -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in self.dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    def restore(self) -> list[str]:
        """Undo any change to the staged files; returns what had changed."""
        changed = []
        now = self._read()
        for path, data in self.files.items():
            if now.get(path) != data:
                changed.append(str(path.relative_to(self.dir)))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        for path in set(now) - set(self.files):
            changed.append(str(path.relative_to(self.dir)))
            path.unlink(missing_ok=True)
        return changed

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------


def _kernel_env(stage: Path | None = None) -> dict:
    env = dict(os.environ)
    if stage is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(stage)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "COURSE_AUTOGRADE": "1"})
    env.pop("PYTHONSTARTUP", None)
    return env


def _error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class _Executor:
    """Runs a notebook cell by cell in one kernel, surviving timeouts and kernel deaths."""

    def __init__(self, nb, cwd: str, kernel_name: str, timeout: int, stage: Path | None = None,
                 deadline: float | None = None, on_cell=None, env_extra: dict | None = None,
                 budget_s: float | None = None):
        from nbclient import NotebookClient

        self.nb, self.cwd, self.kernel_name, self.timeout, self.stage = nb, cwd, kernel_name, timeout, stage
        self.deadline, self.on_cell, self.env_extra = deadline, on_cell, dict(env_extra or {})
        self.budget_s = budget_s
        self.timings: dict[str, float] = {}  # cell index -> seconds (finding slow cells)
        self.client = NotebookClient(
            nb, kernel_name=kernel_name, timeout=timeout, allow_errors=True, interrupt_on_timeout=False,
            record_timing=False, startup_timeout=180, iopub_timeout=10, raise_on_iopub_timeout=False,
            timeout_func=self._timeout_of, resources={"metadata": {"path": cwd}},
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
        self.status: dict[int, str] = {}  # cell index -> ok | error | timeout | crashed | not_run
        self.restarts = 0
        self.log: list[str] = []

    def _timeout_of(self, cell) -> int:
        limit = SETUP_TIMEOUT if cell.get("metadata", {}).get("autograder", {}).get("setup") else self.timeout
        if self.deadline is not None:
            limit = max(1, min(limit, int(self.deadline - time.monotonic())))
        return limit

    async def _start(self):
        client = self.client
        client.km = client.create_kernel_manager()
        env = _kernel_env(self.stage)
        env.update(self.env_extra)
        await client.async_start_new_kernel(cwd=self.cwd, env=env)
        await client.async_start_new_kernel_client()

    async def _stop(self):
        try:
            if self.client.km is not None:
                await self.client._async_cleanup_kernel()
        except Exception:  # noqa: BLE001 - a dead kernel may fail to clean up; nothing to save
            pass

    @staticmethod
    def _cancel_stray_tasks():
        current = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not current:
                task.cancel()

    async def _probe(self) -> bool:
        """After an interrupt: does the kernel answer a trivial request?"""
        kc = self.client.kc
        try:
            msg_id = kc.execute("pass", store_history=False)
            deadline = time.monotonic() + PROBE_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    msg = await kc.shell_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - queue.Empty
                    break
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
        except Exception:  # noqa: BLE001
            return False
        return False

    async def _execute(self, index: int, cell) -> str:
        try:
            await self.client.async_execute_cell(cell, index)
        except Exception as exc:  # noqa: BLE001
            from nbclient.exceptions import CellTimeoutError, DeadKernelError

            self._cancel_stray_tasks()
            if isinstance(exc, CellTimeoutError):
                return "timeout"
            if isinstance(exc, DeadKernelError):
                return "crashed"
            raise
        return "error" if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else "ok"

    async def _recover(self, upto: int) -> bool:
        """A new kernel with the state of the cells before `upto` (tests and failed cells skipped)."""
        if self.restarts >= MAX_KERNEL_RESTARTS:
            return False
        self.restarts += 1
        await self._stop()
        try:
            await self._start()
        except Exception as exc:  # noqa: BLE001
            self.log.append(f"could not restart the kernel: {exc}")
            return False
        for index in range(upto):
            cell = self.nb.cells[index]
            if (cell.get("cell_type") != "code" or self.status.get(index) not in ("ok", "error")
                    or is_test_cell(cell)):
                continue
            original = self.nb.cells[index]
            replay = copy.deepcopy(original)
            try:
                status = await self._execute(index, replay)
            finally:
                self.nb.cells[index] = original
            if status in ("timeout", "crashed"):
                self.log.append(f"replaying cell {index} after a restart failed ({status})")
                return False
        return True

    async def run(self):
        try:
            await self._start()
        except Exception as exc:  # noqa: BLE001
            self.log.append(f"could not start kernel {self.kernel_name!r}: {exc}")
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") == "code":
                    self.status[index] = "not_run"
            return
        alive = True
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") != "code" or not cell.get("source", "").strip():
                    continue
                if not alive:
                    self.status[index] = "not_run"
                    continue
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.status[index] = "not_run"
                    if "budget" not in " ".join(self.log[-1:]):
                        budget = f" of {self.budget_s:g} s" if self.budget_s else ""
                        self.log.append(f"the notebook's time budget{budget} was spent before cell {index}: "
                                        "the rest was not run (--budget)")
                    continue
                began = time.monotonic()
                status = await self._execute(index, cell)
                self.timings[str(index)] = round(time.monotonic() - began, 2)
                cell = self.nb.cells[index]
                self.status[index] = status
                if status == "timeout":
                    limit = self._timeout_of(cell)
                    cell.setdefault("outputs", []).append(
                        _error_output("CellTimeoutError", f"timed out after {limit} s (the kernel was interrupted)"))
                    self.log.append(f"cell {index} timed out after {limit} s")
                    try:
                        await self.client.km.interrupt_kernel()
                        recovered = await self._probe()
                    except Exception:  # noqa: BLE001 - a kernel that cannot be interrupted is replaced
                        recovered = False
                    if not recovered:
                        self.log.append("the kernel did not recover from the interrupt: restarting it")
                        alive = await self._recover(index)
                elif status == "crashed":
                    cell.setdefault("outputs", []).append(
                        _error_output("DeadKernelError", "the kernel died while running this cell (e.g. os._exit, "
                                                         "a segfault, or out of memory)"))
                    self.log.append(f"the kernel died in cell {index}: restarting it")
                    alive = await self._recover(index)
                if not alive:
                    self.log.append("giving up on the rest of this notebook")
                if self.on_cell is not None:
                    self.on_cell(self)
        finally:
            await self._stop()


# ---------------------------------------------------------------------------------------------
# Guard injection
# ---------------------------------------------------------------------------------------------


def inject_guard(nb, guard_name: str, record_path: str | None = None) -> dict[str, str]:
    """Insert the setup cell and wrap every test cell. Returns grade_id -> completion token.
    With `record_path`, the setup cell also starts the recording session (autograder.record)."""
    record = ""
    if record_path is not None:
        record = (f"import autograder.record as _autograder_record\n_autograder_record.start({record_path!r})\n"
                  "del _autograder_record\n")
    setup = nbformat.v4.new_code_cell(
        "# [autograder] grading setup: runs before any submission code\n"
        f"{record}import autograder.integrity as _autograder_integrity\n"
        f"_autograder_integrity.install({guard_name!r})\n"
        "del _autograder_integrity")
    setup.metadata["autograder"] = {"setup": True, "origin": "grader"}
    tokens = {}
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        gid = grade_id(cell)
        token = secrets.token_hex(12)
        tokens[gid] = token
        original = cell.source
        cell.metadata.setdefault("autograder", {})["original_source"] = original
        cell.source = (f"{guard_name}({gid!r})  # [autograder] integrity guard\n{original}\n"
                       f"{guard_name}.done({gid!r}, {token!r})  # [autograder] completion marker")
    nb.cells.insert(0, setup)
    return tokens


def _strip_guard(nb, tokens: dict[str, str]) -> None:
    """Give cells back their own source and remove the markers from their outputs."""
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("autograder", {})
        if "original_source" in meta:
            cell.source = meta.pop("original_source")
        gid = grade_id(cell)
        if gid in tokens:
            marker = f"[autograder] {gid} ok {tokens[gid]}\n"
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream" and marker in out.get("text", ""):
                    out["text"] = out["text"].replace(marker, "")
            cell["outputs"] = [o for o in cell.get("outputs", [])
                               if not (o.get("output_type") == "stream" and not o.get("text"))]


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


def _feedback_of_error(out) -> str:
    ename, evalue = out.get("ename", "Error"), str(out.get("evalue", "")).strip()
    if ename in ("AssertionError", "NotImplementedError", "CellTimeoutError", "DeadKernelError") or not evalue:
        text = f"{ename}: {evalue}" if evalue else ename
        if ename == "NotImplementedError":
            text = "NotImplementedError: this exercise is not finished yet" + (f" ({evalue})" if evalue else "")
    else:
        text = f"{ename}: {evalue.splitlines()[-1] if evalue else ''}"
    return text[:2000]


def _partial(out, max_points):
    """nbgrader: a numeric last expression is partial credit."""
    text = out.get("data", {}).get("text/plain")
    if text is None:
        return None
    try:
        value = float(text if isinstance(text, str) else "".join(text))
    except ValueError:
        return None
    return max(0.0, min(value, max_points))


def score_cell(cell, status: str | None, token: str | None) -> tuple[float, str, str]:
    """(score, status, feedback) of one graded test cell."""
    max_points = points(cell)
    outputs = cell.get("outputs", [])
    if status in (None, "not_run"):
        return 0.0, "not_run", "not run: the kernel kept dying before this cell, so grading stopped"
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if status in ("timeout", "crashed"):
        return 0.0, status, _feedback_of_error(errors[-1]) if errors else status
    if errors:
        feedback = _feedback_of_error(errors[0])
        return 0.0, "integrity" if feedback.startswith("AssertionError: integrity violation") else "failed", feedback
    stderr = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr.strip():
        return 0.0, "failed", ("the cell wrote to stderr, which nbgrader counts as a failure: "
                               + stderr.strip().splitlines()[-1][:500])
    stdout = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    if token is not None and f"[autograder] {grade_id(cell)} ok {token}" not in stdout:
        return 0.0, "integrity", ("integrity: the grader's completion marker is missing, so the cell did not run to its "
                                  "end under the grader's guard")
    for out in outputs:
        if out.get("output_type") == "execute_result":
            partial = _partial(out, max_points)
            if partial is not None:
                return partial, "passed" if partial >= max_points else "partial", f"partial credit: {partial:g}"
    return max_points, "passed", ""


_NEVER_COPY = ("autograder", "course_lib", "sitecustomize", "usercustomize", "torch", "numpy")
MAX_NOTEBOOK_BYTES = 20 << 20  # a submission larger than this is refused, unread
MAX_DATA_BYTES = 50_000_000  # the submission's folder's data files copied next to it
MAX_READBACK_BYTES = 64 << 20  # the executed notebook the sandbox returns
DEFAULT_BUDGET = 900  # seconds for one notebook, all its cells and kernel restarts together


class NoSandbox(RuntimeError):
    """No sandbox can be made here: grading untrusted notebooks is refused (sandbox=False / --unsafe)."""

    def __init__(self, why: str):
        super().__init__(f"refusing to grade: no sandbox can be made here: {why}. Every submission runs untrusted "
                         "code; without a sandbox it can read other submissions and the solutions, and change the "
                         "grader's files. Pass --unsafe (sandbox=False) to grade anyway, only for your own notebooks.")
        self.why = why


class GradingRefused(Exception):
    """A submission the grader will not run (too large, unreadable): the message names the limit."""


def read_submission(path: Path, limit: int = MAX_NOTEBOOK_BYTES):
    """The submission as a notebook, refused before reading if it is larger than `limit` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise GradingRefused(f"the notebook is {size / 2**20:.1f} MB, over the {limit / 2**20:g} MB limit for a "
                             "submission: clear its outputs (Kernel > Restart & Clear Output) and hand it in again")
    with open(path, encoding="utf-8") as f:
        return nbformat.read(f, as_version=4)


def _copy_data_files(submission: Path, workdir: Path) -> None:
    parent = submission.resolve().parent
    files = [p for p in parent.iterdir() if p.is_file()]
    if sum(p.stat().st_size for p in files) >= MAX_DATA_BYTES:
        return
    for item in files:
        # data files only: nothing that could shadow the course's packages on sys.path
        if item.suffix not in (".ipynb", ".pth") and item.stem not in _NEVER_COPY:
            shutil.copy2(item, workdir)


# What the runner in the sandbox may report (autograder.grade._Executor's log). status.json is
# writable by the student's code too: anything else in it would be a channel into the feedback.
_RUNNER_LOG = re.compile(
    r"(cell \d+ timed out after \d+ s|the kernel did not recover from the interrupt: restarting it"
    r"|the kernel died in cell \d+: restarting it|giving up on the rest of this notebook"
    r"|replaying cell \d+ after a restart failed \((timeout|crashed)\)"
    r"|the notebook's time budget( of [0-9.]+ s)? was spent before cell \d+: the rest was not run \(--budget\)"
    r"|could not start kernel '[\w.-]+'|could not restart the kernel)")


def runner_log(lines) -> list[str]:
    """The runner's log lines that have the runner's shape; a count of the others."""
    if not isinstance(lines, list):
        return []
    known = [x for x in lines[:200] if isinstance(x, str) and len(x) < 300 and _RUNNER_LOG.fullmatch(x)]
    if len(known) < len(lines[:200]):
        known.append(f"{len(lines[:200]) - len(known)} line(s) of the sandbox's log are not the runner's: not shown")
    return known[:50]


def run_in_sandbox(nb, submission: Path, *, timeout: int, kernel_name: str, budget_s: float, sandbox: bool,
                   tokens_guard: str | None, limits=None):
    """Execute the prepared notebook `nb` in a fresh sandbox (or, with sandbox=False, a plain
    subprocess over a private copy of the packages). Returns (executed notebook or None, cell
    statuses, log lines, record entries, record problems). Everything read back is untrusted data."""
    from . import sandbox as sb
    from .replay import read_records

    job = Path(tempfile.mkdtemp(prefix="autograde-job-"))
    stage = None
    try:
        for name in ("in", "work", "out"):
            (job / name).mkdir()
        _copy_data_files(submission, job / "work")
        inside = {"in": "/job", "out": "/out", "work": "/work"} if sandbox else \
            {k: str(job / k) for k in ("in", "out", "work")}
        tokens = {}
        if tokens_guard is not None:
            tokens = inject_guard(nb, tokens_guard, record_path=f"{inside['out']}/record.jsonl")
        (job / "in" / "job.json").write_text(json.dumps({
            "out": inside["out"], "cwd": inside["work"], "kernel": kernel_name, "timeout": timeout,
            "budget_s": budget_s}))
        command = [sys.executable, "-m", "autograder.sandbox_exec", f"{inside['in']}/job.json"]
        env = None
        if not sandbox:
            stage = Stage()
            env = _kernel_env(stage.dir)
        rc, _ = sb.run_job(job, command, budget_s=budget_s + 120, sandbox=sandbox, env=env,
                           stdin_data=nbformat.writes(nb).encode("utf-8"), **({"limits": limits} if limits else {}))
        log = []
        if rc is None:
            log.append(f"the notebook's time budget of {budget_s:g} s was spent: the sandbox was ended (--budget)")
        elif rc != 0:  # (its output is the student's to write: not shown)
            log.append(f"the notebook runner exited with status {rc}")
        executed, status = None, {}
        out = job / "out"
        try:
            if (out / "executed.ipynb").is_file() and (out / "executed.ipynb").stat().st_size <= MAX_READBACK_BYTES:
                executed = nbformat.reads((out / "executed.ipynb").read_text(encoding="utf-8"), as_version=4)
            elif (out / "executed.ipynb").is_file():
                log.append(f"the executed notebook is over {MAX_READBACK_BYTES >> 20} MB: its outputs are dropped")
            if (out / "status.json").is_file() and (out / "status.json").stat().st_size <= 4 << 20:
                raw = json.loads((out / "status.json").read_text(encoding="utf-8"))
                status = {int(k): str(v) for k, v in (raw.get("status") or {}).items() if str(k).isdigit()}
                log += runner_log(raw.get("log"))
        except (ValueError, OSError, TypeError, AttributeError) as exc:
            log.append(f"what the sandbox returned could not be read ({type(exc).__name__}); outputs dropped")
            executed, status = None, {}
        if executed is not None and len(executed.cells) != len(nb.cells):
            log.append("the executed notebook does not match the one sent (cells added or removed): outputs dropped")
            executed = None
        if executed is not None:
            for mine, theirs in zip(nb.cells, executed.cells):  # only outputs come back, never the code
                if mine.get("cell_type") == "code":
                    mine["outputs"] = theirs.get("outputs", []) if isinstance(theirs.get("outputs"), list) else []
        entries, problems = read_records(out / "record.jsonl")
        changed = stage.restore() if stage is not None else []
        return nb, status, log, entries, problems, tokens, changed
    finally:
        if stage is not None:
            stage.cleanup()
        shutil.rmtree(job, ignore_errors=True)


def _empty_entry(path, source_path) -> dict:
    return {"path": str(path), "source": str(source_path) if source_path else None, "score": 0.0,
            "max_score": 0.0, "cells": [], "manual_cells": [], "integrity": [], "flags": [], "notes": [],
            "errors": [], "replay": []}


def grade_notebook(path, source_path, *, timeout=DEFAULT_TIMEOUT, kernel_name="python3", guard=True,
                   stage: Stage | None = None, sandbox: bool | None = None, budget_s: float = DEFAULT_BUDGET,
                   max_bytes: int = MAX_NOTEBOOK_BYTES) -> tuple[dict, object]:
    """Grade one submission against its source. Returns (result entry, executed notebook).
    `sandbox`: True (bwrap, required), False (unsafe: a plain subprocess), None: bwrap if available."""
    from . import fingerprint
    from . import sandbox as sb
    from .verdict import Redactor, cell_plan, cell_verdict, replay_plan

    del stage  # (kept for callers: the private package copy is made per run when unsafe)
    started = time.monotonic()
    entry = _empty_entry(path, source_path)
    if source_path is None:
        entry["errors"].append("no source notebook found for this submission (see --source-dir)")
        return entry, None
    source = _read(Path(source_path))
    tests = [c for c in source.cells if is_test_cell(c)]
    entry["max_score"] = sum(points(c) for c in tests)
    try:
        submission = read_submission(Path(path), max_bytes)
    except Exception as exc:  # noqa: BLE001 - too large, unreadable, not JSON, wrong format
        why = str(exc) if isinstance(exc, GradingRefused) else f"could not read the notebook: {type(exc).__name__}: {exc}"
        entry["errors"].append(why[:1000])
        entry["cells"] = [_cell_entry(c, 0.0, "not_run", why[:1000]) for c in tests]
        return entry, None
    if sandbox is None or sandbox:
        if sb.available() is not None:
            raise NoSandbox(sb.available())
        sandbox = True
    entry["sandbox"] = "bwrap" if sandbox else "none (--unsafe)"
    nb, entry["notes"] = assemble(submission, source)
    hidden = [line for c in source.cells if c.get("cell_type") == "code" for line in hidden_lines(c.get("source", ""))]
    redact = Redactor(hidden)
    # The student's code is scanned (evidence); code cells exactly as the instructor wrote them are not.
    instructor = {_visible(c.get("source", "")) for c in source.cells
                  if c.get("cell_type") == "code" and not _nbg(c).get("solution")}
    student_cells = []
    for index, cell in enumerate(nb.cells):
        if (cell.get("cell_type") == "code" and cell["metadata"].get("autograder", {}).get("origin") == "submission"
                and _visible(cell.get("source", "")) not in instructor):
            entry["integrity"] += [f"cell {index}, {f}" for f in scan_source(cell.get("source", ""))]
            entry["flags"] += [f"cell {index}, {f}" for f in review_flags(cell.get("source", ""))]
            student_cells.append((index, cell.get("source", "")))
    entry["flags"] += fingerprint.source_matches(student_cells)
    plans = {grade_id(c): cell_plan(c.get("source", ""), hidden_line_ranges(c.get("source", ""))) for c in nb.cells
             if is_test_cell(c)}
    guard_name = f"__autograder_{secrets.token_hex(6)}__" if guard else None
    nb, status, log, records, problems, tokens, changed = run_in_sandbox(
        nb, Path(path), timeout=timeout, kernel_name=kernel_name, budget_s=budget_s, sandbox=sandbox,
        tokens_guard=guard_name)
    entry["errors"] += log + problems
    entry["integrity"] += [f"changed {f} on disk" for f in changed]
    setup = nb.cells[0] if guard and nb.cells else None
    if setup is not None and status.get(0) != "ok":
        why = next((f"{o.get('ename')}: {o.get('evalue')}" for o in setup.get("outputs", [])
                    if o.get("output_type") == "error"), status.get(0))
        entry["errors"].append(f"the grader's setup cell failed ({why}): the graded cells could not be checked")
    results = replay_plan(plans, records)
    entry["replay"] = [{"exercise": ex, "seed": seed, "passed": ok,
                        "message": redact(msg) if not any(p.hidden for ps in plans.values() for p in ps
                                                          if (p.exercise, p.seed) == (ex, seed)) else
                        ("" if ok else "hidden test: message withheld")}
                       for (ex, seed), (ok, msg) in sorted(results.items())]
    for rec in records:
        entry["flags"] += [f"check_{rec['exercise']}(seed={rec['seed']}): {m}"
                           for m in fingerprint.code_matches(rec.get("code"))]
        calls = rec.get("thread_reference_calls")
        if isinstance(calls, list) and calls:
            entry["flags"].append(f"check_{rec['exercise']}(seed={rec['seed']}): course_lib's counterpart was called "
                                  f"while the check ran ({', '.join(map(str, calls[:3]))})")
    for index, cell in enumerate(nb.cells):
        if is_test_cell(cell):
            gid = grade_id(cell)
            score, state, feedback = score_cell(cell, status.get(index), tokens.get(gid))
            if state == "integrity" and feedback.startswith("AssertionError: integrity violation: "):
                found = feedback.removeprefix("AssertionError: integrity violation: ").split(". The grader restored")[0]
                entry["integrity"] += found.split("; ")
            plan = plans.get(gid, [])
            if plan:
                ok, why = cell_verdict(plan, results)
                if not ok:
                    score, state, feedback = 0.0, "failed", why
                elif state != "passed" and hidden_line_ranges(cell.get("source", "")) and state == "failed":
                    feedback = _kernel_feedback(cell, feedback)
            elif state in ("passed", "partial"):
                entry["notes"].append(f"{gid}: no check call to replay, so its result was decided in the kernel")
            entry["cells"].append(_cell_entry(cell, score, state, redact(feedback)))
        elif is_manual_cell(cell):
            entry["manual_cells"].append({"grade_id": grade_id(cell), "max_score": points(cell)})
    if entry["integrity"]:
        entry["integrity"] = [redact(x) for x in dict.fromkeys(entry["integrity"])]
        reason = ("integrity violation: " + "; ".join(entry["integrity"])[:1500]
                  + ". No credit for this notebook's graded cells (docs/grading.md explains what is checked).")
        for c in entry["cells"]:
            c["check_feedback"] = c["feedback"]
            c.update(score=0.0, passed=False, status="integrity", feedback=reason, message=reason)
    entry["flags"] = [redact(f) for f in dict.fromkeys(entry["flags"])]
    entry["errors"] = [redact(e) for e in entry["errors"]]
    _strip_guard(nb, tokens)
    nb.cells = [c for c in nb.cells if not c.get("metadata", {}).get("autograder", {}).get("setup")]
    entry["score"] = sum(c["score"] for c in entry["cells"])
    entry["max_score"] = sum(c["max_score"] for c in entry["cells"]) or entry["max_score"]
    entry["duration_s"] = round(time.monotonic() - started, 1)
    nb.metadata["autograder"] = {"hidden_lines": hidden}
    return entry, nb


def _kernel_feedback(cell, feedback: str) -> str:
    """A test cell that failed in the kernel: its message, unless it was raised in the hidden part."""
    ranges = hidden_line_ranges(cell.get("metadata", {}).get("autograder", {}).get("original_source", "")
                                or cell.get("source", ""))
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        for frame in out.get("traceback", [])[:3]:
            m = re.search(r"(?:Cell In\[\d*\]|Input In \[\d*\]), line (\d+)", _ansi_free(str(frame)))
            if m:
                line = int(m.group(1)) - 1  # the guard's line comes first
                if any(first <= line <= last for first, last in ranges):
                    return "a hidden test failed in your notebook; its message is withheld (it would show the hidden test)"
                return feedback
    return feedback


_REVIEW_NAMES = {"exec": "runs code from a string (exec)", "eval": "evaluates a string (eval)",
                 "compile": "compiles code at run time (compile)", "b64decode": "decodes base64",
                 "__import__": "imports by name (__import__)", "getsource": "reads source code (inspect.getsource)",
                 "Thread": "starts a thread", "Process": "starts a process", "fork": "forks", "Popen": "runs a program",
                 "system": "runs a shell command"}


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
    return list(dict.fromkeys(flags))[:20]


def _cell_entry(cell, score, status, feedback):
    gid = grade_id(cell)
    return {"cell_id": gid, "grade_id": gid, "score": float(score), "max_score": points(cell),
            "passed": status == "passed", "status": status, "feedback": feedback, "message": feedback}


# ---------------------------------------------------------------------------------------------
# HTML feedback
# ---------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;color:#222}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;white-space:pre-wrap}
.cell{border-left:4px solid #ddd;margin:1em 0;padding-left:.8em}
.pass{border-color:#2da44e}.fail{border-color:#cf222e}.md{color:#444}
.score{font-weight:bold}.out{background:#fff;border:1px solid #eee}.err{background:#ffebe9}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}"""


def _ansi_free(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def render_html(entry: dict, nb) -> str:
    """A self-contained feedback page: the score table, then every cell with its outputs. Test cells
    show their visible part only and no outputs (their feedback instead); any line of a hidden test
    that turns up in an output (a student's cell printing the notebook it runs in) is blanked."""
    from .verdict import Redactor

    hidden = (nb.metadata.get("autograder", {}) if nb is not None else {}).get("hidden_lines", [])
    redact = Redactor(hidden if isinstance(hidden, list) else [])
    esc = lambda text: html.escape(redact(text))  # noqa: E731
    name = html.escape(Path(entry["path"]).name)
    parts = [f"<!doctype html><meta charset=utf-8><title>Feedback: {name}</title><style>{_CSS}</style>",
             f"<h1>{name}</h1><p class=score>Score: {entry['score']:g} / {entry['max_score']:g}</p>"]
    if entry.get("integrity"):
        parts.append("<p class=err><b>Integrity:</b> " + esc("; ".join(entry["integrity"])) + "</p>")
    if entry.get("flags"):
        parts.append("<p class=err><b>Flagged for review:</b> " + esc("; ".join(entry["flags"])) + "</p>")
    parts.append("<table><tr><th>test cell</th><th>points</th><th>result</th><th>feedback</th></tr>")
    for c in entry["cells"]:
        parts.append(f"<tr><td>{html.escape(str(c['grade_id']))}</td><td>{c['score']:g} / {c['max_score']:g}</td>"
                     f"<td>{html.escape(c['status'])}</td><td>{esc(c['feedback'][:300])}</td></tr>")
    parts.append("</table>")
    results = {c["grade_id"]: c for c in entry["cells"]}
    # From the first test cell with hidden tests on, the student's code has seen the hidden inputs
    # (and IPython's input history holds the hidden code): what it printed is not shown.
    after_hidden = False
    for cell in (nb.cells if nb is not None else []):
        if cell.get("cell_type") == "markdown":
            parts.append(f"<div class='cell md'><pre>{esc(cell.source)}</pre></div>")
            continue
        if cell.get("cell_type") != "code":
            continue
        result = results.get(grade_id(cell)) if is_test_cell(cell) else None
        klass = "" if result is None else ("pass" if result["passed"] else "fail")
        parts.append(f"<div class='cell {klass}'>")
        if result is not None:
            parts.append(f"<p class=score>{html.escape(str(result['grade_id']))}: {result['score']:g} / "
                         f"{result['max_score']:g}</p>")
        parts.append(f"<pre>{esc(without_hidden(cell.source) if is_test_cell(cell) else cell.source)}</pre>")
        if after_hidden and not is_test_cell(cell) and cell.get("outputs"):
            parts.append("<p class=md>(outputs of cells run after a hidden test are not shown here: they could "
                         "carry the hidden test's inputs)</p>")
        for out in ([] if is_test_cell(cell) or after_hidden else cell.get("outputs", [])):
            kind = out.get("output_type")
            if kind == "stream":
                parts.append(f"<pre class=out>{esc(out.get('text', ''))}</pre>")
            elif kind == "error":
                tb = "\n".join(out.get("traceback", [])) or f"{out.get('ename')}: {out.get('evalue')}"
                parts.append(f"<pre class='out err'>{esc(_ansi_free(tb))}</pre>")
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "image/png" in data:
                    png = data["image/png"] if isinstance(data["image/png"], str) else "".join(data["image/png"])
                    parts.append(f"<img src='data:image/png;base64,{png.strip()}'>")
                elif "text/plain" in data:
                    text = data["text/plain"] if isinstance(data["text/plain"], str) else "".join(data["text/plain"])
                    parts.append(f"<pre class=out>{esc(text)}</pre>")
        if result is not None and result["feedback"]:
            parts.append(f"<p class=err>{esc(result['feedback'])}</p>")
        parts.append("</div>")
        after_hidden = after_hidden or (is_test_cell(cell) and bool(hidden_line_ranges(cell.source)))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def grade(paths, *, source_dir="solutions", timeout=DEFAULT_TIMEOUT, html_dir=None, kernel_name="python3",
          jobs=1, guard=True, sandbox: bool | None = None, budget_s: float = DEFAULT_BUDGET,
          max_bytes: int = MAX_NOTEBOOK_BYTES, out_dir=None, roots=(), progress=False) -> dict:
    """Grade every notebook in `paths` (worker processes, one sandbox each); one failing notebook
    never stops the others. See autograder.batch for `out_dir` (one JSON each, summary.csv, resume)."""
    from . import sandbox as sb
    from .batch import run_batch

    if sandbox is None or sandbox:
        why = sb.available()
        if why is not None:
            raise NoSandbox(why)
        sandbox = True
    return run_batch(paths, roots=list(roots), source_dir=source_dir, timeout=timeout, html_dir=html_dir,
                     kernel_name=kernel_name, jobs=jobs, guard=guard, sandbox=sandbox, budget_s=budget_s,
                     max_bytes=max_bytes, out_dir=out_dir, progress=progress)


def main(args) -> int:
    from . import sandbox as sb

    paths = []
    for p in args.notebooks:
        p = Path(p)
        paths += sorted(x for x in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in x.parts) if p.is_dir() else [p]
    if not paths:
        print("no notebooks to grade")
        return 2
    why = sb.available()
    if why is not None and not args.unsafe:
        print(NoSandbox(why), file=sys.stderr)
        return 3
    result = grade(paths, source_dir=args.source_dir, timeout=args.timeout, html_dir=args.html,
                   kernel_name=args.kernel, jobs=args.jobs, sandbox=not args.unsafe and why is None,
                   budget_s=args.budget, max_bytes=int(args.max_notebook_mb * (1 << 20)), out_dir=args.out,
                   roots=[Path(p) for p in args.notebooks], progress=not args.quiet)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not args.quiet or len(result["notebooks"]) <= 20:
        for nb in result["notebooks"]:
            flag = (" INTEGRITY" if nb["integrity"] else "") + (f" FLAGGED({len(nb['flags'])})" if nb.get("flags") else "")
            errors = f" ({len(nb['errors'])} problem(s): {nb['errors'][0]})" if nb["errors"] else ""
            print(f"{nb['score']:6g} / {nb['max_score']:<6g} {nb['path']}{flag}{errors}")
    print(f"{result['score']:6g} / {result['max_score']:<6g} total -> {args.json}")
    return 0
