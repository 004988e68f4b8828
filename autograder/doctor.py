"""`python -m autograder grade --doctor`: what a submission's sandbox will see, checked by starting one.

Prints bubblewrap's version, who the sandbox runs as, every mount (read-only, writable, private),
what of the grader's Python is bound and what is skipped, the limits, then what a process inside
one real sandbox finds: its Python, uid, the imports a notebook needs (torch, course_lib,
autograder, the Jupyter kernel), the network, which folders it can write, that the instructor's
files are not there; then the replay's isolation. Exits 0 if grading would work, else 1 with the
reasons.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside the sandbox by the grader's own interpreter; prints one JSON line.
PROBE = r'''
import json, os, resource, socket, sys
out = {"executable": sys.executable, "version": sys.version.split()[0], "prefix": sys.prefix,
       "uid": os.getuid(), "gid": os.getgid(), "imports": {}}
for name in ("torch", "numpy", "course_lib", "autograder", "autograder.checks", "nbformat", "nbclient",
             "jupyter_client", "ipykernel"):
    try:
        module = __import__(name, fromlist=["_"])
        out["imports"][name] = {"ok": True, "version": str(getattr(module, "__version__", "")),
                                "file": str(getattr(module, "__file__", ""))}
    except BaseException as exc:
        out["imports"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
try:
    from jupyter_client.kernelspec import KernelSpecManager
    out["kernel"] = {"ok": True, "argv": KernelSpecManager().get_kernel_spec(KERNEL).argv}
except BaseException as exc:
    out["kernel"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    out["internet"] = "reached 1.1.1.1:53"
except OSError as exc:
    out["internet"] = None
writable = {}
for folder in ("/work", "/out", "/tmp", "/job", "/course", "/course/autograder", sys.prefix):
    try:
        path = os.path.join(folder, ".doctor-probe")
        with open(path, "w") as f:
            f.write("x")
        os.remove(path)
        writable[folder] = True
    except OSError:
        writable[folder] = False
out["writable"] = writable
out["visible"] = {p: os.path.exists(p) for p in PRIVATE}
limits = {}
for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CPU"):
    soft, _ = resource.getrlimit(getattr(resource, name))
    limits[name] = soft
out["limits"] = limits
print(json.dumps(out))
'''


def _mounts(args: list[str]) -> list[str]:
    """bwrap's arguments as one line per mount, in the order bwrap makes them."""
    lines, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("--ro-bind", "--bind"):
            src, dest = args[i + 1], args[i + 2]
            kind = "read-only" if a == "--ro-bind" else "WRITABLE "
            lines.append(f"  {kind} {dest}" + ("" if src == dest else f"  <- {src}"))
            i += 3
        elif a == "--symlink":
            lines.append(f"  symlink   {args[i + 2]} -> {args[i + 1]}")
            i += 3
        elif a == "--tmpfs":
            lines.append(f"  private   {args[i + 1]}  (an empty tmpfs of the sandbox's own)")
            i += 2
        elif a in ("--dev", "--proc"):
            lines.append(f"  {a[2:]:<9} {args[i + 1]}")
            i += 2
        elif a in ("--dir", "--setenv", "--chdir", "--perms", "--size", "--cap-add"):
            i += 3 if a == "--setenv" else 2
        else:
            i += 1
    return lines


def _bwrap_version(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return (done.stdout or done.stderr).strip() or f"exit {done.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run: {exc}"


def _replay_isolation() -> str:
    for module_name in ("autograder.replay_process", "autograder.replay"):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            continue
        describe = getattr(module, "isolation", None)
        if callable(describe):
            try:
                return str(describe())
            except Exception as exc:  # noqa: BLE001 - a report, not a verdict
                return f"could not be described ({type(exc).__name__}: {exc})"
    return "not reported"


def _inside(kernel: str, limits, private: list[str]) -> tuple[dict | None, str]:
    """Start one real sandbox and run PROBE in it: (what it found, or None; the log's tail)."""
    from . import sandbox as sb

    code = PROBE.replace("KERNEL", repr(kernel)).replace("PRIVATE", repr(private))
    job = Path(tempfile.mkdtemp(prefix="autograde-doctor-"))
    try:
        ran = sb.run_job(job, [sys.executable, "-c", code], budget_s=120, limits=limits)
        for line in reversed(ran.report.decode("utf-8", "replace").splitlines()):
            try:
                return json.loads(line), ran.log_tail
            except ValueError:
                continue
        return None, f"exit status {ran.rc}; {ran.log_tail.strip()[-1500:]}"
    finally:
        shutil.rmtree(job, ignore_errors=True)


def doctor(kernel: str = "python3", source_dir: str = "solutions", out=print) -> int:
    from . import sandbox as sb
    from . import sandbox_python as sp

    problems: list[str] = []
    limits = sb.Limits()
    binary = shutil.which(sb.bwrap()) or sb.bwrap()
    out(f"bubblewrap: {_bwrap_version(binary)} ({binary})")
    why = sb.available()
    out("sandbox: " + ("can be made here" if why is None else f"CANNOT be made here: {why}"))
    if why is not None:
        problems.append(why)
    if os.geteuid() == 0:
        out(f"runs as: root builds it, then every process in it runs as a uid of its own "
            f"({sb.UID_BASE}-{sb.UID_BASE + sb.UID_COUNT - 1}, one per running sandbox), no capabilities, "
            "no new privileges")
    else:
        out(f"runs as: uid {os.geteuid()} in a user namespace of its own (unprivileged bwrap), no capabilities")
    out(f"python: {sys.executable} (Python {sys.version.split()[0]}; sys.prefix {sys.prefix}, "
        f"sys.base_prefix {sys.base_prefix})")
    job = Path(tempfile.gettempdir()) / "autograde-job-XXXX"
    out("mounts, in order (everything else does not exist in the sandbox):")
    for line in _mounts(sb.bwrap_args(job, sb.UID_BASE if os.geteuid() == 0 else None, limits)):
        out(line)
    for b in sp.binds():
        out(f"  (bound for the runner: {b.dest}: {b.why})")
    for line in sp.skipped():
        out(f"  skipped: {line}")
    out(f"limits: address space {limits.memory_mb} MB, {limits.processes} processes, files up to {limits.file_mb} MB, "
        f"{limits.cpu_s} s of CPU per process, /tmp {limits.tmp_mb} MB")
    private = [str(ROOT / "solutions"), str(Path(source_dir).resolve()), str(ROOT / "autograder" / "reference"),
               "/course/autograder/reference/__init__.py", "/course/autograder/controls/__init__.py"]
    if why is None:
        found, log = _inside(kernel, limits, private)
        if found is None:
            problems.append(f"a sandbox was started but its probe reported nothing ({log})")
            out(f"inside a sandbox: NOTHING came back ({log})")
        else:
            problems += _report_inside(found, kernel, out)
    out(f"replay isolation: {_replay_isolation()}")
    if problems:
        out("grading would NOT work here:")
        for p in dict.fromkeys(problems):
            out(f"  - {p}")
        return 1
    out("grading would work here")
    return 0


def _report_inside(found: dict, kernel: str, out) -> list[str]:
    problems = []
    out(f"inside a sandbox (one started now): {found['executable']} (Python {found['version']}), "
        f"uid {found['uid']}, gid {found['gid']}")
    for name, result in found["imports"].items():
        if result["ok"]:
            out(f"  import {name}: ok {result['version']} ({result['file']})")
        else:
            out(f"  import {name}: FAILED {result['error']}")
            problems.append(f"the sandbox's Python cannot import {name} ({result['error']})")
    course = found["imports"].get("course_lib", {})
    if course.get("ok") and not str(course.get("file", "")).startswith("/course/"):
        problems.append(f"course_lib comes from {course['file']}, not the read-only /course")
    if found["kernel"]["ok"]:
        out(f"  kernel {kernel!r}: {' '.join(found['kernel']['argv'])}")
    else:
        out(f"  kernel {kernel!r}: FAILED {found['kernel']['error']}")
        problems.append(f"the sandbox has no Jupyter kernel {kernel!r} ({found['kernel']['error']})")
    out(f"  network: interfaces {', '.join(found['interfaces']) or 'none'}; "
        + ("the internet is NOT reachable" if found["internet"] is None else f"the internet IS reachable ({found['internet']})"))
    if found["internet"] is not None or set(found["interfaces"]) - {"lo"}:
        problems.append("the sandbox has a network")
    writable = [f for f, ok in found["writable"].items() if ok]
    out(f"  writable: {', '.join(writable) or 'nothing'}; read-only: "
        + ", ".join(f for f, ok in found["writable"].items() if not ok))
    if set(writable) - {"/work", "/out", "/tmp"}:
        problems.append(f"the sandbox can write {', '.join(sorted(set(writable) - {'/work', '/out', '/tmp'}))}")
    visible = [p for p, seen in found["visible"].items() if seen]
    out("  instructor's files: " + ("none visible" if not visible else "VISIBLE: " + ", ".join(visible)))
    if visible:
        problems.append(f"the sandbox sees the instructor's files ({', '.join(visible)})")
    lim = found["limits"]
    out(f"  limits seen inside: address space {lim['RLIMIT_AS'] >> 20 if lim['RLIMIT_AS'] > 0 else 'unlimited'} MB, "
        f"{lim['RLIMIT_NPROC']} processes, files up to {lim['RLIMIT_FSIZE'] >> 20 if lim['RLIMIT_FSIZE'] > 0 else 'unlimited'} MB, "
        f"{lim['RLIMIT_CPU']} s of CPU")
    return problems
