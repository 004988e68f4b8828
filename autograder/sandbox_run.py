"""One submission run in a sandbox of its own, within its limits: read under a size limit, its data
files copied (never a symbolic link), the notebook sent to the runner (`autograder.sandbox_exec`), and
back only the runner's report and the record (`autograder.runner_report`). With sandbox=False a plain
subprocess over a private copy of the packages (`Stage`)."""
from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import nbformat

from .executor import _kernel_env
from .guard_cells import inject_guard
from .notebook_cells import is_test_cell


ROOT = Path(__file__).resolve().parent.parent
GUARDED_PACKAGES = (ROOT / "autograder", ROOT / "course_lib")


_NEVER_COPY = ("autograder", "course_lib", "sitecustomize", "usercustomize", "torch", "numpy")
# Never copied beside the notebook: notebooks, and what Python imports or runs (graded code lives in the
# notebook's cells, which the grader reads).
_CODE_SUFFIXES = (".ipynb", ".pth", ".py", ".pyw", ".pyc", ".pyo", ".pyi", ".so", ".pyd", ".zip", ".egg", ".whl")
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
        # data files only: no code the kernel could import (a module handed in beside the notebook is
        # code the scan never reads: red team round 11 hid course_lib's formula, wires emptied, in a
        # helper.py), nothing that could shadow the course's packages on sys.path
        if Path(entry.name).suffix.lower() in _CODE_SUFFIXES or Path(entry.name).stem in _NEVER_COPY:
            continue
        with _open_no_follow(Path(entry.path)) as src, open(workdir / entry.name, "wb") as dst:
            shutil.copyfileobj(src, dst)


# What the runner in the sandbox may report (autograder.executor._Executor's log). Its report comes
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
            "sandbox": bool(sandbox), "data": sb.DATA if sandbox else None}))
        command = runner_command(f"{inside['in']}/job.json")
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


def runner_command(job_json: str) -> list[str]:
    """The runner's command line. `python -m` puts the folder it starts in first on `sys.path`, so a
    `json.py` among the student's files in /work would be the runner's `import json`, run before the
    runner guards anything (red team round 11). So the sandbox starts the runner in /job (the grader's
    read-only folder: job.json only; the kernel still runs in /work), and `-P` (Python 3.11+) leaves
    that folder off `sys.path` as well."""
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, "-m", "autograder.sandbox_exec", job_json]


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


def unneeded_from(nb, outputs_before: int) -> int | None:
    """The first cell the grader need not run: past the last graded test cell nothing it runs can
    change a score, and from the first hidden test on no output comes back (autograder.runner_report),
    so a cell that is both is work without a reader (nb05's load sweep: 14 s of its 20). None when
    every cell is needed (a notebook without graded cells is run whole)."""
    tests = [i for i, cell in enumerate(nb.cells) if is_test_cell(cell)]
    return max(tests[-1] + 1, outputs_before) if tests else None
