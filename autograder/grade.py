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
import io
import json
import os
import re
import secrets
import shutil
import stat
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
    """'<assignment>/<name>.ipynb' -> source path, for nbgrader's source layout
    `<source-dir>/<assignment>/<name>.ipynb` (checkpoints, and notebooks at other depths, ignored)."""
    index: dict[str, Path] = {}
    if not source_dir.is_dir():
        return index
    for path in sorted(source_dir.rglob("*.ipynb")):
        rel = path.relative_to(source_dir)
        if ".ipynb_checkpoints" not in rel.parts and len(rel.parts) == 2:
            index.setdefault(rel.as_posix(), path)
    return index


def source_lookup(submission: Path, index: dict[str, Path]) -> tuple[Path | None, str]:
    """(source, "") for the assignment the submission's folder names, or (None, why not).

    The folder decides, never the file's name or content (nbgrader's layout
    `submitted/<student>/<assignment>/<name>.ipynb`): the source with the same folder and file
    name; else, if that assignment has exactly one notebook, that one (a student's renamed copy:
    `source_mismatch` refuses it if it is another assignment's notebook). A folder that names no
    assignment is refused: a file name alone would let `00_setup.ipynb` in any folder be graded as
    the easiest assignment."""
    folder = submission.parent.name
    if f"{folder}/{submission.name}" in index:
        return index[f"{folder}/{submission.name}"], ""
    assignments: dict[str, list[str]] = {}
    for key in index:
        assignment, name = key.split("/", 1)
        assignments.setdefault(assignment, []).append(name)
    if folder in assignments:
        names = assignments[folder]
        if len(names) == 1:
            return index[f"{folder}/{names[0]}"], ""
        return None, (f"no source notebook for this submission: assignment {folder!r} has no notebook named "
                      f"{submission.name!r} (its notebooks: {', '.join(sorted(names))})")
    known = ", ".join(sorted(assignments)[:30]) or "none"
    return None, (f"no source notebook for this submission: its folder {folder[:100]!r} names no assignment of the "
                  f"source folder (assignments: {known}); hand notebooks in as "
                  "<student>/<assignment>/<notebook>.ipynb (see --source-dir)")


def find_source(submission: Path, index: dict[str, Path]) -> Path | None:
    """The source notebook of a submission (`source_lookup`), or None."""
    return source_lookup(submission, index)[0]


def answer_ids(nb) -> set[str]:
    """The grade ids of a notebook's answer and graded cells: what makes it that assignment."""
    return {str(grade_id(c)) for c in nb.cells if grade_id(c) and (_nbg(c).get("solution") or _nbg(c).get("grade"))}


def source_mismatch(submission, source_ids: set[str], source_name: str, others: dict[str, set[str]]) -> str | None:
    """Why `submission` is not a notebook of the assignment its folder names, or None.

    Refused when fewer than half of the source's answer and graded cells (by nbgrader grade_id)
    are in it while at least half of another source's are (ids the two share are not counted):
    a 00_setup notebook handed in as 01_static_batching. A notebook that lost its metadata matches
    nothing and is graded as usual (its tests are restored from the source)."""
    present = {str(grade_id(c)) for c in submission.cells if grade_id(c)}
    if not source_ids:
        return None
    mine = len(source_ids & present) / len(source_ids)
    best, best_name, best_counts = 0.0, None, (0, 0)
    for name, ids in sorted(others.items()):
        theirs = set(ids) - source_ids
        if name == source_name or not theirs:
            continue
        share = len(theirs & present) / len(theirs)
        if share > best:
            best, best_name, best_counts = share, name, (len(theirs & present), len(theirs))
    if mine >= 0.5 or best < 0.5 or best <= mine:
        return None
    return (f"this notebook does not match {source_name}, the assignment its folder names: "
            f"{len(source_ids & present)} of its {len(source_ids)} answer and graded cells (nbgrader grade_id) "
            f"are in it, while {best_counts[0]} of {best_counts[1]} of {best_name}'s are: it is another "
            f"assignment's notebook, refused and not graded; hand in the notebook of {source_name}")


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


def unneeded_from(nb, outputs_before: int) -> int | None:
    """The first cell the grader need not run: past the last graded test cell nothing it runs can
    change a score, and from the first hidden test on no output comes back (autograder.runner_report),
    so a cell that is both is work without a reader (nb05's load sweep: 14 s of its 20). None when
    every cell is needed (a notebook without graded cells is run whole)."""
    tests = [i for i, cell in enumerate(nb.cells) if is_test_cell(cell)]
    return max(tests[-1] + 1, outputs_before) if tests else None


def _error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class _Executor:
    """Runs a notebook cell by cell in one kernel, surviving timeouts and kernel deaths.

    A cell's outputs are what it printed while it ran: a later cell's display update
    (`update_display`, or a display with the same display_id) does not rewrite them (it would
    carry what the code saw in the cells between into an earlier cell's outputs)."""

    def __init__(self, nb, cwd: str, kernel_name: str, timeout: int, stage: Path | None = None,
                 deadline: float | None = None, on_cell=None, env_extra: dict | None = None,
                 budget_s: float | None = None, skip_from: int | None = None):
        from nbclient import NotebookClient

        self.nb, self.cwd, self.kernel_name, self.timeout, self.stage = nb, cwd, kernel_name, timeout, stage
        self.deadline, self.on_cell, self.env_extra = deadline, on_cell, dict(env_extra or {})
        self.budget_s = budget_s
        self.skip_from = skip_from  # cells from here on are not run (unneeded_from)
        self.timings: dict[str, float] = {}  # cell index -> seconds (finding slow cells)
        self.client = NotebookClient(
            nb, kernel_name=kernel_name, timeout=timeout, allow_errors=True, interrupt_on_timeout=False,
            record_timing=False, startup_timeout=180, iopub_timeout=10, raise_on_iopub_timeout=False,
            timeout_func=self._timeout_of, resources={"metadata": {"path": cwd}},
            shutdown_kernel="immediate",  # (a graceful shutdown waits ~1 s; nothing of the kernel is kept)
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
        self.client._update_display_id = lambda display_id, msg: None  # (no output changes after its cell)
        # No frontend for widgets: nbclient would mimic one for Output widgets (interact's) by sending
        # comm messages on the shell channel while it waits for the cell's reply on that channel, a race
        # that leaves the cell hanging until its timeout now and then (jupyter/nbclient#312: 60 s lost in
        # one notebook of four with a slider, under --jobs 2). What such a widget shows goes to the cell.
        self.client.comm_open_handlers = {"jupyter.widget": lambda msg: None}
        self.status: dict[int, str] = {}  # cell index -> ok | error | timeout | crashed | not_run | skipped
        self.runner_errors: dict[int, dict] = {}  # cell index -> the error output this runner added to it
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
        env.pop("AUTOGRADER_SEED_KEY", None)  # (the instructor's key: never the student's code's to read)
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
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.log.append(f"could not start kernel {self.kernel_name!r}: {why}")  # (before any of the notebook ran)
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") == "code":
                    self.status[index] = "not_run"
            return
        alive = True
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") != "code" or not cell.get("source", "").strip():
                    continue
                if self.skip_from is not None and index >= self.skip_from:
                    self.status[index] = "skipped"
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
                    self.runner_errors[index] = _error_output(
                        "CellTimeoutError", f"timed out after {limit} s (the kernel was interrupted)")
                    cell.setdefault("outputs", []).append(self.runner_errors[index])
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
                    self.runner_errors[index] = _error_output(
                        "DeadKernelError", "the kernel died while running this cell (e.g. os._exit, "
                                           "a segfault, or out of memory)")
                    cell.setdefault("outputs", []).append(self.runner_errors[index])
                    self.log.append(f"the kernel died in cell {index}: restarting it")
                    alive = await self._recover(index)
                if not alive:
                    self.log.append("giving up on the rest of this notebook")
                if self.on_cell is not None:
                    self.on_cell(self, index)
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


def _open_no_follow(path: Path):
    """A read-only binary file object for `path`, refused if it is a symbolic link (O_NOFOLLOW: the
    check and the open are one step) or not a regular file (a FIFO would block the grader)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        if os.path.islink(path):
            raise GradingRefused(f"{path} is a symbolic link: refused (a submission's files are never followed "
                                 "out of its folder)") from None
        raise
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise GradingRefused(f"{path} is not a regular file: refused")
    return f


def read_submission(path: Path, limit: int = MAX_NOTEBOOK_BYTES):
    """The submission as a notebook, refused before reading if it is larger than `limit` bytes, a
    symbolic link or not a regular file."""
    with _open_no_follow(Path(path)) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise GradingRefused(f"the notebook is {size / 2**20:.1f} MB, over the {limit / 2**20:g} MB limit for a "
                                 "submission: clear its outputs (Kernel > Restart & Clear Output) and hand it in again")
        return nbformat.read(io.TextIOWrapper(f, encoding="utf-8"), as_version=4)


def _copy_data_files(submission: Path, workdir: Path) -> None:
    """Copy the regular files next to the submission (data its notebook reads) into the sandbox's
    working folder. A symbolic link there refuses the submission: following it would copy whatever
    it points at (the answer key) to where the student's code can print it."""
    parent = Path(os.path.abspath(submission)).parent
    with os.scandir(parent) as entries:
        found = sorted(entries, key=lambda e: e.name)
    for entry in found:
        if entry.is_symlink():
            raise GradingRefused(f"{parent.parent.name}/{parent.name}/{entry.name} is a symbolic link: refused "
                                 "(a submission's files are never followed out of its folder)")
    files = [e for e in found if e.is_file(follow_symlinks=False)]
    if sum(e.stat(follow_symlinks=False).st_size for e in files) >= MAX_DATA_BYTES:
        return
    for entry in files:
        # data files only: nothing that could shadow the course's packages on sys.path
        if Path(entry.name).suffix in (".ipynb", ".pth") or Path(entry.name).stem in _NEVER_COPY:
            continue
        with _open_no_follow(Path(entry.path)) as src, open(workdir / entry.name, "wb") as dst:
            shutil.copyfileobj(src, dst)


# What the runner in the sandbox may report (autograder.grade._Executor's log). Its report comes
# over a channel the student's code cannot write, but it is checked line by line all the same.
_RUNNER_LOG = re.compile(
    r"(cell \d+ timed out after \d+ s|the kernel did not recover from the interrupt: restarting it"
    r"|the kernel died in cell \d+: restarting it|giving up on the rest of this notebook"
    r"|replaying cell \d+ after a restart failed \((timeout|crashed)\)"
    r"|the notebook's time budget( of [0-9.]+ s)? was spent before cell \d+: the rest was not run \(--budget\)"
    r"|could not start kernel '[\w.-]+'(: [^\n]{1,300})?|could not restart the kernel)")


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
    statuses, log lines, the record's bytes (parsed only in the replay's process), record problems).
    Everything read back is untrusted data."""
    from . import runner_report
    from . import sandbox as sb
    from .replay import load_record

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
        # What comes back is the runner's report alone (autograder.runner_report): no cell output
        # from the first hidden test on, over a pipe only the runner holds, marked with a nonce
        # that reaches it on stdin before any student code runs.
        probe = runner_report.add_integrity_probe(nb, tokens_guard)
        nonce = secrets.token_hex(16)
        outputs_before = runner_report.first_hidden_cell(nb)
        (job / "in" / "job.json").write_text(json.dumps({
            "cwd": inside["work"], "kernel": kernel_name, "timeout": timeout, "budget_s": budget_s,
            "outputs_before": outputs_before, "skip_from": unneeded_from(nb, outputs_before),
            "sandbox": bool(sandbox)}))
        command = [sys.executable, "-m", "autograder.sandbox_exec", f"{inside['in']}/job.json"]
        env = None
        if not sandbox:
            stage = Stage()
            env = _kernel_env(stage.dir)
            env.pop("AUTOGRADER_SEED_KEY", None)
        ran = sb.run_job(job, command, budget_s=budget_s + 120, sandbox=sandbox, env=env,
                         stdin_data=nonce.encode() + b"\n" + nbformat.writes(nb).encode("utf-8"),
                         **({"limits": limits} if limits else {}))
        log = []
        if ran.rc is None:
            log.append(f"the notebook's time budget of {budget_s:g} s was spent: the sandbox was ended (--budget)")
        elif ran.rc != 0:  # (its output is the student's to write: not shown)
            log.append(f"the notebook runner exited with status {ran.rc}")
        if ran.report_cut:
            log.append(f"the runner's report is over {sb.MAX_REPORT_BYTES >> 20} MB: the rest of it is dropped")
        report = runner_report.Report(ran.report, nonce, len(nb.cells))
        status = runner_report.merge(nb, report, tokens, probe)
        log += runner_log(report.log) + report.problems
        out = job / "out"
        record, problems = load_record(out / "record.jsonl")
        changed = stage.restore() if stage is not None else []
        return nb, status, log, record, problems, tokens, changed, report.seconds
    finally:
        if stage is not None:
            stage.cleanup()
        shutil.rmtree(job, ignore_errors=True)


def _empty_entry(path, source_path) -> dict:
    return {"path": str(path), "source": str(source_path) if source_path else None, "score": 0.0,
            "max_score": 0.0, "cells": [], "manual_cells": [], "integrity": [], "flags": [], "copies": [],
            "notes": [], "errors": [], "replay": []}


def grade_notebook(path, source_path, *, timeout=DEFAULT_TIMEOUT, kernel_name="python3", guard=True,
                   stage: Stage | None = None, sandbox: bool | None = None, budget_s: float = DEFAULT_BUDGET,
                   max_bytes: int = MAX_NOTEBOOK_BYTES) -> tuple[dict, object]:
    """Grade one submission against its source. Returns (result entry, executed notebook).
    `sandbox`: True (bwrap, required), False (unsafe: a plain subprocess), None: bwrap if available."""
    from . import fingerprint
    from .counterpart_refs import counterpart_references
    from . import sandbox as sb
    from .hidden_seeds import hide_in, keyed_source
    from .verdict import Redactor, cell_plan, cell_verdict, replay_budget, replay_plan

    del stage  # (kept for callers: the private package copy is made per run when unsafe)
    started = time.monotonic()
    entry = _empty_entry(path, source_path)
    if source_path is None:
        entry["errors"].append("no source notebook found for this submission (see --source-dir)")
        return entry, None
    source = keyed_source(_read(Path(source_path)))  # (hidden seeds derived from --seed-key, if given)
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
    # What the released notebook gives (scaffolding: never the student's copy, nor a review flag).
    given = fingerprint.given_by(source)
    given_review = {f.split(": ", 1)[-1] for text in given.cells for f in review_flags(text)}
    student_cells = []
    for index, cell in enumerate(nb.cells):
        if (cell.get("cell_type") == "code" and cell["metadata"].get("autograder", {}).get("origin") == "submission"
                and _visible(cell.get("source", "")) not in instructor):
            entry["integrity"] += [f"cell {index}, {f}" for f in scan_source(cell.get("source", ""))]
            entry["flags"] += [f"cell {index}, {f}" for f in review_flags(cell.get("source", ""))
                               if f.split(": ", 1)[-1] not in given_review]
            student_cells.append((index, cell.get("source", "")))
    copies = fingerprint.source_copies(student_cells, given)
    entry["flags"] += counterpart_references(student_cells, "\n".join(given.cells))
    plans = {grade_id(c): cell_plan(c.get("source", ""), hidden_line_ranges(c.get("source", ""))) for c in nb.cells
             if is_test_cell(c)}
    guard_name = f"__autograder_{secrets.token_hex(6)}__" if guard else None
    timings = entry["timings"] = {"prepare_s": round(time.monotonic() - started, 2)}  # where the time goes
    mark = time.monotonic()
    nb, status, log, records, problems, tokens, changed, cell_seconds = run_in_sandbox(
        nb, Path(path), timeout=timeout, kernel_name=kernel_name, budget_s=budget_s, sandbox=sandbox,
        tokens_guard=guard_name)
    entry["errors"] += log + problems
    entry["integrity"] += [f"changed {f} on disk" for f in changed]
    setup = nb.cells[0] if guard and nb.cells else None
    if setup is not None and status.get(0) != "ok":
        why = next((f"{o.get('ename')}: {o.get('evalue')}" for o in setup.get("outputs", [])
                    if o.get("output_type") == "error"), status.get(0))
        entry["errors"].append(f"the grader's setup cell failed ({why}): the graded cells could not be checked")
    timings["sandbox_s"], mark = round(time.monotonic() - mark, 2), time.monotonic()
    timings["cells_s"] = {str(k): v for k, v in sorted(cell_seconds.items())}  # the runner's clock, per cell
    skipped = sum(1 for v in status.values() if v == "skipped")
    if skipped:
        entry["notes"].append(f"{skipped} code cell(s) after the last graded test were not run: no score depends on "
                              "them and none of their output would come back")
    verdict = replay_plan(plans, records, budget_s=replay_budget(budget_s, time.monotonic() - started))
    timings["replay_s"], mark = round(time.monotonic() - mark, 2), time.monotonic()
    results, records = verdict.results, verdict.entries  # records: each line's evidence, from the replay's process
    entry["errors"] += verdict.problems
    entry["flags"] += verdict.flags
    entry["replay"] = [{"exercise": ex, "seed": seed, "passed": ok,
                        "message": redact(msg) if not any(p.hidden for ps in plans.values() for p in ps
                                                          if (p.exercise, p.seed) == (ex, seed)) else
                        ("" if ok else "hidden test: message withheld")}
                       for (ex, seed), (ok, msg) in sorted(results.items())]
    copies += fingerprint.code_copies(records, student_cells, given)
    entry["flags"] += [c.flag for c in copies]
    entry["copies"] = [c.evidence() for c in copies]  # each with both pieces of code, side by side
    for rec in records:
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
    entry["copies"] = [{k: redact(v) for k, v in c.items()} for c in entry.get("copies", [])]
    entry["errors"] = [redact(e) for e in entry["errors"]]
    _strip_guard(nb, tokens)
    nb.cells = [c for c in nb.cells if not c.get("metadata", {}).get("autograder", {}).get("setup")]
    entry["score"] = sum(c["score"] for c in entry["cells"])
    entry["max_score"] = sum(c["max_score"] for c in entry["cells"]) or entry["max_score"]
    timings["evidence_s"] = round(time.monotonic() - mark, 2)
    entry["duration_s"] = round(time.monotonic() - started, 1)
    nb.metadata["autograder"] = {"hidden_lines": hidden}
    shown = {p.seed for ps in plans.values() for p in ps if not p.hidden}
    entry = hide_in(entry, {p.seed for ps in plans.values() for p in ps if p.hidden} - shown)  # (no hidden seed shown)
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

# The page lives in autograder/feedback_html.py (every student text escaped, a strict CSP); the
# names stay importable from here.
from .feedback_html import _ansi_free, render_html  # noqa: E402,F401


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
    from .batch import find_notebooks, terminal_safe

    paths = []
    for p in args.notebooks:
        p = Path(p)
        # symbolic links below a folder are listed, not followed: the batch refuses them by name
        paths += find_notebooks(p) if p.is_dir() else [p]
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
            print(f"{nb['score']:6g} / {nb['max_score']:<6g} {terminal_safe(nb['path'] + flag + errors)}")
    print(f"{result['score']:6g} / {result['max_score']:<6g} total -> {args.json}")
    return 0
