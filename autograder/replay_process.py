"""The replay's own process: a record's consequences stay inside it.

The grader replays a record (hostile data) with its own checks and engine objects. Whatever a
forged record might still make that code do, it does in a child process forked from the grader's
worker (cheap: torch, course_lib and the checks are already imported), which

- can write no file at all and open no network connection, where the kernel has Landlock (a
  ruleset handling every write, make, remove, truncate, execute right and TCP bind / connect,
  with no rule granting any; signals and abstract sockets scoped to itself); as root without
  Landlock it drops to the unprivileged uid 65534 (nobody) instead; and in every case no file may
  grow (RLIMIT_FSIZE 0);
- runs under the notebook's budget: CPU seconds (RLIMIT_CPU) and wall time (killed by the
  parent), address space (RLIMIT_AS: what the worker already maps plus the sandbox's memory
  limit), no core dump;
- holds no file descriptor of the grader's but /dev/null and the pipe it answers on (not the
  worker pool's queues, not the job folder), with one torch thread;
- answers as small JSON lines over that pipe, which the parent reads with limits (bytes, line
  size, nesting) as the hostile data they might be.

The parent never writes anything the child says anywhere but into the verdict it builds. A child
that dies, runs out of time or memory leaves what it answered before; `autograder.verdict` gives
the rest a zero with the reason (`Outcome.stopped`). `isolation()` says in one line what this
machine gives the child (`grade --doctor` prints it).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import signal
import sys
import time
from dataclasses import dataclass, field

MAX_REPLY_BYTES = 64 << 20  # everything the child may answer (verdicts and the record's evidence)
MAX_REPLY_LINE = 16 << 20
MAX_REPLY_DEPTH = 32
NOBODY = 65534
WALL_GRACE_S = 5  # the wall-clock kill comes after the CPU limit, for a child that sleeps or blocks

# Landlock (linux/landlock.h); the syscall numbers are the same on every architecture.
_SYS_CREATE_RULESET, _SYS_RESTRICT_SELF = 444, 446
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
# Every access right of each ABI version, but reading files and directories.
_FS_RIGHTS = {1: (1 << 0) | (1 << 1) | sum(1 << b for b in range(4, 13)), 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}
_NET_RIGHTS = (1 << 0) | (1 << 1)  # bind, connect TCP (ABI 4)
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def isolation() -> str:
    """One line: what the replay's process gets on this machine."""
    abi = landlock_abi()
    if abi:
        walls = f"no file writes and no network (Landlock ABI {abi})"
    elif os.geteuid() == 0:
        walls = f"the unprivileged uid {NOBODY} (no Landlock in this kernel), no file may grow"
    else:
        walls = "no file may grow (no Landlock in this kernel: the grader's uid can write what it owns)"
    return (f"replay in a forked process: {walls}; the notebook's time budget (CPU and wall) and memory limit; "
            "no descriptor of the grader's but its answer pipe")


def _restrict_landlock(abi: int) -> None:
    fs = sum(bits for version, bits in _FS_RIGHTS.items() if abi >= version)
    fields = [fs] + ([_NET_RIGHTS] if abi >= 4 else []) + ([_SCOPES] if abi >= 6 else [])
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)


def _mapped_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _enter_child(answer_fd: int, budget_s: float, memory_mb: int) -> str:
    """In the forked child: cut it off from everything of the grader's. Returns what it got."""
    os.setpgid(0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG) instead of killing
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted({0, 1, 2, answer_fd})
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = limit if 0 < limit < (1 << 20) else 1 << 16
    for low, high in zip(keep, keep[1:] + [limit]):
        os.closerange(low + 1, high)
    cpu = max(1, math.ceil(budget_s))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + (memory_mb << 20),) * 2)
    abi = landlock_abi()
    if abi:
        _restrict_landlock(abi)
        got = f"Landlock ABI {abi}"
    elif os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        got = f"uid {NOBODY}"
    else:
        got = "no Landlock (the grader's own uid)"
    import torch

    torch.set_num_threads(1)
    return got


@dataclass
class Outcome:
    messages: list[dict] = field(default_factory=list)  # what the child answered, parsed with limits
    stopped: str | None = None  # why it did not finish (None: it did)
    isolation: str = ""  # what the child got (its first answer)
    seconds: float = 0.0  # wall time, fork to reaped


def run_isolated(work, *, budget_s: float, memory_mb: int) -> Outcome:
    """Run `work(send)` in a forked, isolated child; `send(dict)` answers one JSON line."""
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            got = _enter_child(write_fd, budget_s, memory_mb)
            send = _sender(write_fd)
            send({"isolation": got})
            work(send)
        except BaseException as exc:  # noqa: BLE001 - whatever happens, the child ends here
            code = 70
            try:
                _sender(write_fd)({"fatal": f"{type(exc).__name__}: {exc}"[:2000]})
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(code)
    os.close(write_fd)
    out = Outcome()
    data, timed_out, overflow = bytearray(), False, False
    deadline = started + budget_s + WALL_GRACE_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REPLY_BYTES:
                overflow = True
                break
    finally:
        os.close(read_fd)
        if timed_out or overflow:
            _kill(pid)
        status = _reap(pid, kill_after=2.0)
    out.seconds = time.monotonic() - started
    out.messages = _parse_answers(bytes(data))
    got = next((m["isolation"] for m in out.messages if isinstance(m.get("isolation"), str)), "")
    out.isolation = got[:200]
    fatal = next((m["fatal"] for m in out.messages if isinstance(m.get("fatal"), str)), None)
    if timed_out:
        out.stopped = f"the replay ran past its time budget of {budget_s:g} s and was stopped"
    elif overflow:
        out.stopped = f"the replay answered more than {MAX_REPLY_BYTES >> 20} MB and was stopped"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            out.stopped = f"the replay ran past its time budget of {budget_s:g} s of CPU and was stopped"
        elif sig == signal.SIGKILL:
            out.stopped = "the replay's process was killed (out of memory?)"
        else:
            out.stopped = f"the replay's process died ({signal.Signals(sig).name})"
    elif os.WEXITSTATUS(status) != 0:
        code = os.WEXITSTATUS(status)
        out.stopped = f"the replay failed: {fatal}" if fatal else f"the replay's process exited with status {code}"
    return out


def _sender(fd: int):
    def send(message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    return send


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            continue


def _reap(pid: int, kill_after: float) -> int:
    """Wait for the child; kill it if it has not ended `kill_after` seconds after closing its pipe."""
    end = time.monotonic() + kill_after
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > end:
            _kill(pid)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.01)


def _parse_answers(data: bytes) -> list[dict]:
    """The child's JSON lines, parsed with limits (what it says is derived from hostile data)."""
    from .replay import nesting_depth

    out = []
    for line in data.split(b"\n"):
        if not line or len(line) > MAX_REPLY_LINE or nesting_depth(line) > MAX_REPLY_DEPTH:
            continue
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(message, dict):
            out.append(message)
    return out
