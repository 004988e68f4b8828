"""Which of the grader's own Python the sandbox must see, and where.

The runner in the sandbox is the grader's interpreter (`sys.executable`), and the notebook's kernel
is started from it: the sandbox binds, read-only and at the same paths, the real locations of
`sys.prefix`, `sys.base_prefix`, `sys.exec_prefix`, the interpreter's folder (as named and
resolved: a venv's `bin/python` is a link to its base's), the site-packages folders and the other
`sys.path` folders the grader's Python imports from. A venv names absolute paths (its `pyvenv.cfg`,
its scripts, `.pth` files), so each is bound where the grader sees it, and also at its resolved
location when a link leads there. Bound after the sandbox's private `/tmp`, so that a Python under
`/tmp` (a venv in /tmp/venv) is seen, not hidden by it (bubblewrap mounts in argument order).

Never bound: a folder that holds the course repository (its `solutions/`), the temporary folder,
the home or the working folder (where submissions and grades are): a Python installed there is
refused with the reason and the fix; a `sys.path` entry that is such a folder (the repository
itself, from `pip install -e .` or the current folder) is only skipped, the course's packages
come from `/course`. `problems()` says why grading cannot work from this Python, `binds()` what
is mounted (`python -m autograder grade --doctor` prints both).
"""
from __future__ import annotations

import os
import site
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ("/usr", "/etc", "/bin", "/lib", "/lib64", "/sbin")  # bound whole by the sandbox (read-only)
UNUSABLE = ("/proc", "/dev", "/sys", "/job")  # the sandbox's own mounts: a bind there is hidden or impossible


@dataclass(frozen=True)
class Bind:
    source: str  # the real location on this machine
    dest: str  # where the sandbox sees it (the path the grader's Python uses)
    why: str  # what needs it (shown by --doctor)


def is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _private_folders() -> dict[str, str]:
    """Folders whose contents a submission must never see -> what they are."""
    out = {str(ROOT): "the course repository (solutions/, the grader's files)"}
    out.setdefault(os.path.realpath(tempfile.gettempdir()), "the temporary folder (other submissions' jobs)")
    out.setdefault(os.path.realpath(os.getcwd()), "the current folder (submissions, grades)")
    home = os.path.expanduser("~")
    if home not in ("/", "~"):
        out.setdefault(os.path.realpath(home), "the home folder")
    return out


def _wanted() -> list[tuple[str, str, bool]]:
    """(path, why, required) of what the grader's Python needs."""
    wanted = [(sys.prefix, "sys.prefix", True), (sys.base_prefix, "sys.base_prefix", True),
              (sys.exec_prefix, "sys.exec_prefix", True), (sys.base_exec_prefix, "sys.base_exec_prefix", True),
              (os.path.dirname(os.path.abspath(sys.executable)), "the interpreter's folder", True),
              (os.path.dirname(os.path.realpath(sys.executable)), "the resolved interpreter's folder", True)]
    sites = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        sites.append(site.getusersitepackages())
    wanted += [(p, "site-packages", False) for p in sites]
    wanted += [(p, "sys.path entry", False) for p in sys.path]
    return [(os.path.abspath(p), why, required) for p, why, required in wanted
            if p and os.path.isabs(p) and os.path.exists(p)]


def _plan() -> tuple[list[Bind], list[str], list[str]]:
    """(binds, problems that make grading impossible, entries skipped and why)."""
    private = _private_folders()
    binds: list[Bind] = []
    problems: list[str] = []
    skipped: list[str] = []
    prefixes = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    for path, why, required in _wanted():
        real = os.path.realpath(path)
        if os.path.isfile(real):  # (a zip on sys.path: its folder is bound with the prefix)
            continue
        holds = next(((folder, what) for folder, what in private.items()
                      if is_under(folder, real) or is_under(folder, path)), None)
        inside_repo = is_under(real, str(ROOT)) and not any(is_under(real, p) for p in prefixes if p != str(ROOT))
        if holds is not None or (inside_repo and not required):
            folder, what = holds or (str(ROOT), "the course repository")
            if required:
                problems.append(f"{why} {path} holds {what} ({folder}): the sandbox would show it to every "
                                "submission. Install the course's Python in a folder of its own (for example "
                                "python -m venv /opt/course-venv; /opt/course-venv/bin/pip install -e '.[dev]') and "
                                "run the grader with it")
            else:
                skipped.append(f"{path} ({why}): holds {what}, not mounted (the course's code comes from /course)")
            continue
        for target in dict.fromkeys([path, real]):
            bad = next((u for u in UNUSABLE if is_under(target, u)), None)
            if bad is not None:
                message = (f"{why} {target} lies under {bad}, which the sandbox uses for itself: install the course's "
                           "Python elsewhere (for example python -m venv /opt/course-venv)")
                (problems if required else skipped).append(message)
                continue
            if target == real and any(is_under(target, s) for s in SYSTEM):
                continue  # (the system folders are bound whole)
            binds.append(Bind(real, target, why))
    return _minimal(binds), list(dict.fromkeys(problems)), list(dict.fromkeys(skipped))


def _minimal(binds: list[Bind]) -> list[Bind]:
    """Without the binds another one already covers (same place, same contents), shortest first."""
    kept: list[Bind] = []
    for b in sorted(binds, key=lambda b: (len(b.dest), b.dest)):
        covered = False
        for k in kept:
            if is_under(b.dest, k.dest):
                inside = os.path.realpath(k.source + b.dest[len(k.dest):])
                covered = inside == b.source
                if covered:
                    break
        if not covered and not any(k.dest == b.dest for k in kept):
            kept.append(b)
    return kept


def binds() -> list[Bind]:
    return _plan()[0]


def skipped() -> list[str]:
    return _plan()[2]


def problems(drops_to_uid: bool | None = None) -> list[str]:
    """Why the sandbox cannot run this Python (empty if it can). `drops_to_uid`: the sandbox runs
    as another user (the grader is root), so every bound folder must be readable by others."""
    found = _plan()[1]
    if drops_to_uid is None:
        drops_to_uid = os.geteuid() == 0
    if drops_to_uid:
        for b in binds():
            try:
                mode = os.stat(b.source).st_mode
            except OSError as exc:
                found.append(f"{b.source} ({b.why}) cannot be read: {exc}")
                continue
            if stat.S_ISDIR(mode) and (mode & 0o005) != 0o005:
                found.append(f"{b.source} ({b.why}) is not readable by other users (mode {stat.filemode(mode)}): the "
                             f"sandbox's user (uid 60000-60999) cannot use it; run chmod o+rx {b.source}")
    return found
