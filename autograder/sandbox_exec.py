"""Inside the sandbox: run one prepared notebook cell by cell and report what happened.

`python -m autograder.sandbox_exec JOB.json < NONCE+NOTEBOOK`: the notebook (hidden tests included)
comes on stdin and never exists as a file in the sandbox, and this process makes itself
non-dumpable, so that the student's code (same uid) can read neither; the kernel gets each cell
only when it runs.

The report goes back over this process's own stdout, which nothing else in the sandbox holds:
before anything starts, the pipe is moved to a private descriptor (not inherited) and fd 1 and 2
become the job's log, so that the kernel and whatever the student starts write there. Nothing is
written to `/out` (the student's code can write there too; only the record, which the grader
replays, lies there). What the report holds is `autograder.runner_report`'s whitelist. At the
end, in the sandbox, this process kills every other process in it (`kill(-1)`: all it may signal,
which in its pid namespace is everything the notebook started) before its last line.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

MAX_OUTPUT_CHARS = 100_000  # per cell, all its outputs together
MAX_OUTPUTS = 50  # per cell
MAX_IMAGE_CHARS = 2_000_000  # base64 of one image


def cap_outputs(cell) -> bool:
    """Trim a cell's outputs to the caps (head and tail of long text kept). True if trimmed."""
    outputs = cell.get("outputs", [])
    trimmed = False
    if len(outputs) > MAX_OUTPUTS:
        outputs[:] = outputs[: MAX_OUTPUTS - 1] + outputs[-1:]
        trimmed = True
    budget = MAX_OUTPUT_CHARS
    for out in outputs:
        if "text" in out:
            text = out["text"] if isinstance(out["text"], str) else "".join(out["text"])
            if len(text) > budget:
                half = max(0, budget // 2)
                text = text[:half] + f"\n[... output cut: {len(text) - budget} characters over the limit ...]\n" + \
                    (text[-half:] if half else "")
                trimmed = True
            out["text"] = text
            budget = max(0, budget - len(text))
        for key in ("data",):
            data = out.get(key)
            if not isinstance(data, dict):
                continue
            for mime in list(data):
                value = data[mime] if isinstance(data[mime], str) else "".join(map(str, data[mime]))
                limit = MAX_IMAGE_CHARS if mime.startswith("image/") else budget
                if len(value) > limit:
                    del data[mime]
                    data.setdefault("text/plain", f"[{mime} output dropped: {len(value)} characters over the limit]")
                    trimmed = True
                elif not mime.startswith("image/"):
                    budget = max(0, budget - len(value))
        if "traceback" in out:
            tb = "\n".join(out["traceback"])[-20_000:]
            out["traceback"] = [tb]
    return trimmed


def _private_channel() -> int:
    """This process's stdout (the grader's pipe) moved to a descriptor only it holds; fd 1 now
    goes where fd 2 does (the job's log), and fd 0 reads nothing once the job is read."""
    channel = os.dup(1)  # (os.dup: not inheritable, so no child, the kernel included, gets it)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(os.dup(2), "w", buffering=1)
    return channel


def _writer(fd: int):
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return write


def _in_sandbox() -> bool:
    """True in the sandbox's pid namespace (its pid 1 is bubblewrap), never in the grader's."""
    try:
        with open("/proc/1/comm", encoding="utf-8") as f:
            return os.getpid() != 1 and f.read().strip() == "bwrap"
    except OSError:
        return False


def _others() -> list[int]:
    """Other live processes in this pid namespace (zombies are dead: they cannot write)."""
    me, alive = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(int(name))
    return alive


def end_other_processes(timeout: float = 10.0) -> list[int]:
    """SIGKILL everything else in the sandbox (kill(-1) spares only this process and pid 1), until
    nothing else is alive. Returns the pids still alive at `timeout` (none, normally)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # (reap this process's own children)
                pass
        except ChildProcessError:
            pass
        left = _others()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): processes of the same uid (the kernel) cannot read this one's
    memory through /proc/<pid>/mem (it holds the hidden tests). Best effort off Linux."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def copy_data_files(data: str, cwd: str) -> None:
    """The submission's data files (read-only at `data`) into the notebook's folder, the sandbox's
    private /work, where the notebook may change them."""
    import shutil

    for name in sorted(os.listdir(data)):
        source = os.path.join(data, name)
        if os.path.isfile(source) and not os.path.islink(source):
            shutil.copyfile(source, os.path.join(cwd, name))


def main(job_path: str) -> int:
    channel = _private_channel()
    _not_dumpable()

    from .lean_imports import skip_slow_optional_imports

    skip_slow_optional_imports()  # (before nbformat: 1.3 s of this runner's start, once per notebook)
    import nbformat

    from .executor import _Executor
    from .runner_report import Reporter

    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    nonce, _, text = sys.stdin.buffer.read().partition(b"\n")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # (stdin is spent: the kernel inherits nothing of it)
    os.close(devnull)
    nb = nbformat.reads(text.decode("utf-8"), as_version=4)
    if job.get("data"):
        copy_data_files(job["data"], job["cwd"])
    deadline = time.monotonic() + float(job["budget_s"])
    reporter = Reporter(_writer(channel), nonce.decode("ascii"), nb, int(job["outputs_before"]), cap_outputs)
    executor = _Executor(nb, job["cwd"], job["kernel"], int(job["timeout"]), deadline=deadline,
                         on_cell=reporter.cell_done, budget_s=float(job["budget_s"]), skip_from=job.get("skip_from"))
    asyncio.run(executor.run())
    left = end_other_processes() if job.get("sandbox") and _in_sandbox() else []
    reporter.finish(executor, len(left))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
