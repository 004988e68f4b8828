"""RECORD side: inside the sandbox, every check call a test cell makes is recorded as plain data.

The grader's setup cell (the first cell of the notebook it executes, before any student code)
calls `start(path)`. From then on `check_<adapter>(impl, seed)` (see `_checking.check`) does not
judge by itself: it hands the check's body a membrane proxy of `impl` (`autograder.membrane`),
and when the call ends, one JSON line goes to `path`: the exercise, the seed, every crossing of
the boundary, the check's own outcome (evidence only), fingerprints of the adapter's code and
any calls into the exercise's course_lib counterpart by the student's code or from other threads. The grader then
replays each line in its own process (`autograder.replay`); the verdict is the replay's.

Without a session (a student running the notebook, pytest) a check runs as it always did.
"""
from __future__ import annotations

import json
import os
import sys
import threading

SESSION = None
MAX_RECORD_BYTES = 256 << 20


class Session:
    def __init__(self, path: str):
        self.path = path  # appended to: a kernel restarted after a crash replays the setup cell
        try:
            self.written = os.path.getsize(path)
        except OSError:
            self.written = 0
        # A check call is being recorded, on whichever thread: a check the student's code calls from a
        # thread of its own meanwhile runs unrecorded (one record line at a time).
        self.recording = False

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n"
        if self.written + len(line) > MAX_RECORD_BYTES:
            line = json.dumps({"exercise": entry.get("exercise"), "seed": entry.get("seed"), "events": [],
                               "outcome": {"ok": False, "type": "RecordLimit",
                                           "msg": "the record grew past its size limit"}}) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.written += len(line)


def start(path: str) -> None:
    """Called by the grader's setup cell."""
    global SESSION
    SESSION = Session(path)


def _counterpart_code(exercise: str):
    """The code object of the exercise's counterpart when it is a plain function (None otherwise:
    a class may be an allowed base that the student's subclass calls into)."""
    from .exercises import BY_ADAPTER

    e = BY_ADAPTER.get(exercise)
    if e is None or not e.counterpart:
        return None
    module_name, _, name = e.counterpart.partition(":")
    value = getattr(sys.modules.get(module_name), name, None)
    return getattr(value, "__code__", None)


def counterpart_modules(exercise: str) -> set[str]:
    """The course_lib module(s) whose calls the recorder notes for this exercise (by name)."""
    from .exercises import BY_ADAPTER

    e = BY_ADAPTER.get(exercise)
    return {e.counterpart.split(":")[0]} if e is not None and e.counterpart else set()


def _counterpart_files(exercise: str) -> dict[str, str]:
    from .exercises import BY_ADAPTER

    e = BY_ADAPTER.get(exercise)
    if e is None or not e.counterpart:
        return {}
    module = sys.modules.get(e.counterpart.split(":")[0])
    path = getattr(module, "__file__", None)
    return {os.path.abspath(path): module.__name__} if path else {}


class _ThreadWatch:
    """Calls into the exercise's course_lib counterpart while the check runs: from threads started
    during the check (any call into its module), and on the check's own thread a call of the
    counterpart function itself by the student's code (its caller is a notebook cell or the
    student's module; the check's own calls, and a subclass calling an allowed base, do not count).
    A check that bans such calls itself installs its own profiler inside its block (this one is
    then off, and back when the block ends): a check without a ban is still watched."""

    def __init__(self, exercise: str, is_user_file):
        self.is_user_file = is_user_file  # the checks' rule (autograder._checking.is_user_file)
        self.files = _counterpart_files(exercise)
        self.code = _counterpart_code(exercise)
        self.hits: list[str] = []
        self.installed = False

    def _note(self, frame, where: str):
        if len(self.hits) < 20:
            self.hits.append(f"{self.files[frame.f_code.co_filename]}.{frame.f_code.co_name} ({where})")

    def __enter__(self):
        if not self.files:
            return self
        is_user_file = self.is_user_file

        def other_threads(frame, event, arg):
            if event == "call" and frame.f_code.co_filename in self.files:
                self._note(frame, "another thread")

        def this_thread(frame, event, arg):
            if event == "call" and frame.f_code is self.code:
                caller = frame.f_back
                if caller is not None and is_user_file(caller.f_code.co_filename):
                    self._note(frame, "called by your code")

        threading.setprofile(other_threads)
        if self.code is not None and sys.getprofile() is None:
            sys.setprofile(this_thread)
            self.installed = True
        return self

    def __exit__(self, *exc):
        if self.files:
            threading.setprofile(None)
            if self.installed:
                sys.setprofile(None)
        return False


def through_membrane(name, impl, seed, refuse, run, *, fail, describe_exception, is_user_file) -> bool:
    """Run a check call through a membrane when one is due. True if it ran here (record or
    replay), False if the caller should run the check as usual (no session, no stub).
    `fail`, `describe_exception`, `is_user_file`: the checks' own (autograder._checking), handed in
    so that the recording imports nothing of the checks."""
    from .recording.active import activated, active_membrane
    from .recording.machine import Membrane
    from .recording.errors import RecordLimit
    from .recording.proxy import is_proxy

    if is_proxy(impl):  # a replay stub, or a recorded adapter handed to a nested check
        m = object.__getattribute__(impl, "_ag_membrane")
        outermost = active_membrane() is None
        with activated(m):
            if m.mode == "replay" and outermost:
                message = m.hook("reject", None)
                if message:
                    fail(str(message))
            run(impl, seed)
        return True
    session = SESSION
    if session is None or active_membrane() is not None or session.recording:
        return False
    from .fingerprint import code_fingerprints

    m = Membrane("record", exercise=name, fail=fail, describe_exception=describe_exception)
    proxy = m.root(impl)
    entry = {"exercise": name, "seed": seed, "impl": dict(m.s_info[0])}
    try:
        entry["code"] = code_fingerprints(impl)
    except Exception:  # noqa: BLE001 - a fingerprint is evidence; never let it stop the check
        entry["code"] = []
    outcome = {"ok": False, "type": "Interrupted", "msg": "the check did not finish"}
    watch = _ThreadWatch(name, is_user_file)
    session.recording = True
    try:
        with activated(m):
            try:
                refuse(impl)
                message = None
            except AssertionError as exc:
                message = str(exc)
            m.hook("reject", message)
            if message:
                fail(message)
            with watch:
                run(proxy, seed)
        outcome = {"ok": True}
    except RecordLimit as exc:
        outcome = {"ok": False, "type": "RecordLimit", "msg": str(exc)}
        raise AssertionError(f"{name}: {exc}") from None
    except BaseException as exc:
        outcome = {"ok": False, "type": type(exc).__name__, "msg": str(exc)[:4000]}
        raise
    finally:
        session.recording = False
        entry.update(events=m.events, outcome=outcome, thread_reference_calls=watch.hits)
        try:
            session.write(entry)
        except (OSError, ValueError) as exc:  # a full disk or a value JSON cannot hold: the replay will say
            print(f"[autograder] could not write the record: {exc}", file=sys.__stdout__)
    return True
