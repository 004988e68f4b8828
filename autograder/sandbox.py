"""One submission, one sandbox: bubblewrap (`bwrap`, Debian's `bubblewrap` package).

What the notebook's kernel (and everything it starts) gets:

- a new mount namespace whose root is empty but for: the system (`/usr`, `/etc`, read-only), the
  grader's Python (read-only, at the same paths, wherever it lives, even under `/tmp`: see
  `autograder.sandbox_python`), the course's code (`course_lib/`, `autograder/` at `/course`,
  read-only, with `autograder/reference/` (the answer key), `controls/` and `mutants/` hidden under
  empty folders), the job
  (`/job`: the job's description, read-only, where the runner starts: never the student's folder,
  whose modules would shadow the runner's imports), the submission's data files (read-only at
  `/data`), and, writable, `/work` (the kernel's cwd, where the runner copies the data files), `/out`
  (the record the kernel writes) and `/tmp`: each a size-capped tmpfs of the sandbox's own
  (`Limits.work_mb`, `out_mb`, `tmp_mb`), so the host's disk holds only the record (bound at
  `/out/record.jsonl`) and the log, each capped by the file size limit;
- no view of the grader's files, the sources (`solutions/`), the source cache or any other
  submission: they are simply not mounted;
- new pid, network (loopback only), ipc and uts namespaces; `--die-with-parent`: when the grader
  ends the sandbox (done, or the time budget spent), every process in it dies with it, including
  any the student detached;
- an unprivileged user: a uid of its own (60000-60999, one per running sandbox, so that the
  per-user process limit is per sandbox), no capabilities, no new privileges;
- limits (`prlimit`): address space, processes, file size, CPU seconds; the outputs it returns
  are capped by the grader when it reads them;
- one way back that the student's code cannot write: the runner's own stdout, a pipe that only
  the runner holds (`autograder.sandbox_exec`); `run_job` collects it, size-capped.

As root, bwrap builds the namespaces and `setpriv` then drops to the sandbox's uid (root is
needed to mount what an unprivileged user may not traverse, like a Python under `/root`); as a
normal user, bwrap runs unprivileged in a user namespace. `available()` says why a sandbox
cannot be had here; the grader refuses to run without one unless told `--unsafe`.
"""
from __future__ import annotations

import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from course_lib import kernel_cache

from . import sandbox_python

ROOT = Path(__file__).resolve().parent.parent
BWRAP_ENV = "AUTOGRADER_BWRAP"  # the bubblewrap binary, if not `bwrap` on PATH


def bwrap() -> str:
    return os.environ.get(BWRAP_ENV, "bwrap")
UID_BASE, UID_COUNT = 60000, 1000
# Folders of autograder/ that hold right answers (the answer key, the checks' controls: correct
# solutions written differently) or the grader's mutants: hidden in the sandbox.
INSTRUCTOR_ONLY = ("reference", "controls", "mutants")
LOCK_DIR = Path("/tmp/autograder-uids")
PREBUILT_KERNELS = "/course/kernels"  # where the sandbox sees the grader's compiled kernels
DATA = "/data"  # the submission's data files, read-only (the runner copies them into /work)
RECORD = "record.jsonl"  # the one file of /out that is the host's: what the kernel records


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 8192  # address space per process (torch maps a lot it never touches)
    processes: int = 512  # threads count too
    file_mb: int = 256  # the largest file a process may write
    tmp_mb: int = 1024  # the private /tmp
    cpu_s: int = 1800  # CPU seconds per process
    work_mb: int = 1024  # the private /work (the kernel's cwd)
    out_mb: int = 16  # the private /out, beside the record (a file of the host's, capped by file_mb)


def _system_dirs() -> list[tuple[str, str]]:
    """('ro-bind' | 'symlink', path) for the base system."""
    out = []
    for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"):
        p = Path(d)
        if p.is_symlink():
            out.append(("symlink", d))
        elif p.is_dir():
            out.append(("ro-bind", d))
    return out


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_args(job: Path, uid: int | None, limits: Limits) -> list[str]:
    """The bwrap command line (everything before the command) for one job folder, which holds
    `in/` (mounted read-only at /job), `work/` (/work) and `out/` (/out)."""
    args = [bwrap()]
    for kind, d in _system_dirs():
        if kind == "symlink":
            args += ["--symlink", os.readlink(d), d]
        else:
            args += ["--ro-bind", d, d]
    # The private /tmp first: a bind under /tmp made before it would be hidden by it.
    args += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    args += ["--perms", "0755", "--dir", "/course",
             "--ro-bind", str(ROOT / "course_lib"), "/course/course_lib",
             "--ro-bind", str(ROOT / "autograder"), "/course/autograder"]
    for private in INSTRUCTOR_ONLY:  # the answer key and the other right answers: not for students' eyes
        if (ROOT / "autograder" / private).is_dir():
            args += ["--tmpfs", f"/course/autograder/{private}"]
    # The grader's compiled C kernels, read-only: the notebook loads them instead of compiling its own in
    # its private /tmp (course_lib/kernel_cache.py; ~2 s a notebook). Keyed by source, flags and CPU.
    kernels = kernel_cache.cache_dir()
    if kernels.is_dir():
        args += ["--ro-bind", str(kernels), PREBUILT_KERNELS]
    # /work and /out are tmpfs of the sandbox's own, size-capped (on the host's disk, only the file size
    # was capped, not how many files: red team round 11 put 3 GB there within half a second with
    # fallocate, and paths too deep to walk). The submission's data files come read-only at /data (the
    # runner copies them into /work); of /out, only the record is the host's (one file, file_mb at most).
    args += ["--ro-bind", str(job / "in"), "/job", "--ro-bind", str(job / "work"), DATA,
             "--perms", "0777", "--size", str(limits.work_mb << 20), "--tmpfs", "/work",
             "--perms", "0777", "--size", str(limits.out_mb << 20), "--tmpfs", "/out",
             "--bind", str(job / "out" / RECORD), f"/out/{RECORD}"]
    # Then the grader's Python, last: at its own paths, wherever it lives (a venv in /tmp/venv, or
    # under /work), over the sandbox's folders if need be. Its parent folders are made here, open to
    # the sandbox's user (bwrap would copy the host's modes: pytest's 0700 temporary folders).
    made, bound = {"/tmp", "/course", "/job", DATA, "/work", "/out", "/dev", "/proc"}, []
    for b in sandbox_python.binds():
        for a in _ancestors(b.dest + "/x"):
            if a not in made and not any(sandbox_python.is_under(a, s) for s in sandbox_python.SYSTEM + tuple(bound)):
                args += ["--perms", "0755", "--dir", a]
                made.add(a)
        args += ["--ro-bind", b.source, b.dest]
        bound.append(b.dest)
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--chdir", "/job", "--clearenv"]
    if uid is not None and os.geteuid() == 0:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
           "PYTHONPATH": "/course", "TMPDIR": "/tmp", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
           "JUPYTER_DATA_DIR": "/tmp/jupyter-data", "IPYTHONDIR": "/tmp/ipython", "MPLCONFIGDIR": "/tmp/mpl",
           "MPLBACKEND": "Agg", "COURSE_LIB_KERNEL_CACHE": "/tmp/kernels", "LANG": "C.UTF-8"}
    if kernels.is_dir():
        env[kernel_cache.PREBUILT_ENV] = PREBUILT_KERNELS
    for k, v in env.items():
        args += ["--setenv", k, v]
    return args


def _drop_privileges(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _prlimit(limits: Limits) -> list[str]:
    return ["prlimit", f"--as={limits.memory_mb << 20}", f"--nproc={limits.processes}",
            f"--fsize={limits.file_mb << 20}", f"--cpu={limits.cpu_s}", "--core=0", "--"]


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None if a sandbox can be made here, else why not (shown to the user)."""
    missing = [tool for tool in (bwrap(), "prlimit") + (("setpriv",) if os.geteuid() == 0 else ())
               if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not found: install bubblewrap and util-linux (scripts/setup.sh does: "
                f"apt-get install bubblewrap; ${BWRAP_ENV} names another bwrap)")
    probe = [bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net",
             "--die-with-parent"]
    if os.geteuid() == 0:
        probe += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"] + _drop_privileges(UID_BASE) + ["true"]
    else:
        probe += ["--unshare-user", "--", "true"]
    try:
        run = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start a sandbox: {exc}"
    if run.returncode != 0:
        why = (run.stderr or run.stdout).strip().splitlines()
        return ("bwrap cannot create namespaces here (" + (why[-1] if why else f"exit {run.returncode}") + "); "
                "on Debian/Ubuntu enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) "
                "or run the grader as root")
    python = sandbox_python.problems()
    if python:
        return "the sandbox cannot run this Python: " + "; ".join(python)
    return None


class UidLease:
    """A uid no other running sandbox of this machine holds (a lock file per uid)."""

    def __init__(self):
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        start = os.getpid() % UID_COUNT
        for i in range(UID_COUNT):
            uid = UID_BASE + (start + i) % UID_COUNT
            f = open(LOCK_DIR / f"{uid}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self.uid, self._file = uid, f
            return
        raise RuntimeError(f"all {UID_COUNT} sandbox uids are in use")

    def release(self):
        try:
            fcntl.flock(self._file, fcntl.LOCK_UN)
        finally:
            self._file.close()


def prepare_job(job: Path, uid: int | None) -> None:
    """in/ and work/ (the data files: read-only for the sandbox), out/ and its record (writable by its uid)."""
    for name in ("in", "work", "out"):
        (job / name).mkdir(parents=True, exist_ok=True)
    (job / "out" / RECORD).touch()
    os.chmod(job, 0o711)
    os.chmod(job / "in", 0o755)
    if uid is not None and os.geteuid() == 0:
        for p in [job / "out", *(job / "out").rglob("*")]:
            os.chown(p, uid, uid, follow_symlinks=False)
    for name in ("in", "work"):
        for p in [job / name, *(job / name).rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


MAX_REPORT_BYTES = 64 << 20  # what the runner may send back over its stdout


@dataclass
class JobResult:
    rc: int | None  # the exit status, None if it was killed at its budget
    log_tail: str  # the end of its stderr (everything in the sandbox may write there: never shown)
    report: bytes  # what the command wrote on its stdout (in the sandbox: only the runner can)
    report_cut: bool  # the report was over MAX_REPORT_BYTES: the rest was dropped


def run_job(job: Path, command: list[str], *, budget_s: float, limits: Limits = Limits(), sandbox: bool = True,
            env: dict | None = None, stdin_data: bytes = b"") -> JobResult:
    """Run `command` for a job folder, in a sandbox (or, unsafe, as a plain subprocess), `stdin_data`
    on its stdin; kill it and everything it started after `budget_s` seconds. Its stdout comes back
    (size-capped), its stderr goes to the job's log."""
    lease = UidLease() if sandbox and os.geteuid() == 0 else None
    uid = lease.uid if lease else None
    log_path = job / "sandbox.log"
    try:
        if sandbox:
            prepare_job(job, uid)
            argv = _prlimit(limits) + bwrap_args(job, uid, limits) + ["--"]
            if uid is not None:
                argv += _drop_privileges(uid)
            argv += command
        else:
            argv = command
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True, env=env)
            feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin_data), daemon=True)
            feeder.start()  # (a thread: a runner that never reads must not block the grader)
            report = _Collector(proc.stdout, MAX_REPORT_BYTES)
            try:
                rc = proc.wait(timeout=budget_s)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                _kill_group(proc)
            data, cut = report.result(timeout=10)
        return JobResult(rc, _tail(log_path), data, cut)
    finally:
        if lease:
            lease.release()


class _Collector:
    """Reads a pipe to its end in a thread, keeping at most `limit` bytes (the rest is drained)."""

    def __init__(self, pipe, limit: int):
        self.pipe, self.limit, self.chunks, self.size, self.cut = pipe, limit, [], 0, False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while True:
                chunk = self.pipe.read1(1 << 16)
                if not chunk:
                    break
                if self.size + len(chunk) > self.limit:
                    self.cut = True
                    chunk = chunk[: max(0, self.limit - self.size)]
                self.chunks.append(chunk)
                self.size += len(chunk)
        except (OSError, ValueError):
            pass

    def result(self, timeout: float) -> tuple[bytes, bool]:
        self.thread.join(timeout)  # (the pipe ends with the sandbox: every process in it is dead by now)
        try:
            self.pipe.close()
        except OSError:
            pass
        return b"".join(self.chunks), self.cut


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(0)  # (the pid namespace goes with its first process: nothing of the job survives it)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
