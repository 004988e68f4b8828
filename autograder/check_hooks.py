"""What a check watches while the student's code runs: the calls it makes into given modules (to refuse
a function that merely calls the reference) and the Python lines it executes (loops show up as growth).
Under the grading membrane the sandbox notes what it saw and the grader's replay reads it back."""
from __future__ import annotations

import contextlib
import sys

from .check_failures import fail
from .recording.active import active_membrane
from .reference_refusal import REFERENCE_MESSAGE
from .user_code import is_user_file


# The membrane of the check call in progress (autograder.recording.active, a context variable): set
# by `check` while its body runs on a recorded or replayed adapter, so that the hooks below note or
# read back what they saw.


@contextlib.contextmanager
def _hooked(kind: str, value, fill):
    """Around a hook's block: in RECORD mode note `value` when the block ends, in REPLAY mode
    `fill` it from the record (the student's code never runs in the grader, so it saw nothing)."""
    m = active_membrane()
    if m is None:
        yield value
        return
    from .membrane import Divergence, RecordLimit

    try:
        yield value
    except (Divergence, RecordLimit, KeyboardInterrupt):
        raise
    except BaseException:
        fill(value, m.hook(kind, value if m.mode == "record" else None))
        raise
    fill(value, m.hook(kind, value if m.mode == "record" else None))


def _fill_list(target, recorded):
    if isinstance(recorded, list):
        target[:] = [tuple(x) if isinstance(x, (list, tuple)) else x for x in recorded]


def _fill_counter(target, recorded):
    if isinstance(recorded, list) and recorded and isinstance(recorded[0], int):
        target[0] = recorded[0]


@contextlib.contextmanager
def watch_calls(modules, direct_only=(), allowed=()):
    """Record (module name, function name) of every call into code from `modules` in the block (modules,
    or single functions: autograder.call_tripwire), and of calls the student's code makes itself into
    `direct_only`'s; `allowed`: functions (or classes) of `modules` left unwatched, by name
    ("module:qualname")."""
    m = active_membrane()
    if m is not None and m.mode == "replay":
        with _hooked("watch", [], _fill_list) as hits:
            yield hits
        return
    with _hooked("watch", [], _fill_list) as hits, _watch_calls(modules, hits, direct_only, allowed):
        yield hits


@contextlib.contextmanager
def _watch_calls(modules, hits, direct_only=(), allowed=()):
    # Trip wires in the modules' functions, not a profile hook: a hook runs a Python callback on every
    # call and return of all the block's code and doubled the recorded checks (autograder.call_tripwire).
    from .call_tripwire import tripwires

    with tripwires(modules, hits, direct_only, allowed):
        yield hits


def _own_check_modules(name: str) -> list:
    """The loaded modules of exercise `name`'s check package: the check's own computation of the answer
    is there, a right answer the student's code could call (reached through `sys.modules`)."""
    from .exercises import BY_ADAPTER

    if name not in BY_ADAPTER:
        return []
    package = f"autograder.checks.{BY_ADAPTER[name].module}"
    return [mod for key, mod in list(sys.modules.items())
            if mod is not None and (key == package or key.startswith(package + "."))]


@contextlib.contextmanager
def forbid_calls(name: str, modules, enabled: bool = True, allowed=()):
    """Fail if code from `modules` (the reference of this exercise) runs inside the block: it
    catches a student function that merely calls the reference, however it was imported. `allowed`:
    functions (or classes) of `modules` the student may call, by name ("module:qualname"): helpers the
    notebook hands them that compute no part of this exercise's answer (docs/grading.md)."""
    if not enabled:
        yield
        return
    hits = []
    # Recording for the grader, the student's code gets the check's objects and callbacks through the
    # membrane's proxies, so a call it makes itself into the check's own code is one it reached on its
    # own. (Without a membrane, in the notebook, it calls a harness's callbacks itself: not watched.)
    membrane = active_membrane()
    own = _own_check_modules(name) if membrane is not None and membrane.mode == "record" else []
    try:
        with watch_calls(modules, own, allowed) as hits:
            yield
    finally:
        # Read once the watch has closed: replaying a record, that is when the calls are filled in from it
        # (read inside, a function that merely calls the reference passed the grader's replay). Even when
        # the student's code then crashed: this is the reason to report.
        if hits:
            module, func = hits[0]
            fail(f"{name} {REFERENCE_MESSAGE} (it calls {module}.{func})")


@contextlib.contextmanager
def count_user_lines():
    """Count the Python lines the student's code executes in the block (loops show up as growth)."""
    m = active_membrane()
    if m is not None and m.mode == "replay":
        with _hooked("lines", [0], _fill_counter) as counter:
            yield counter
        return
    with _hooked("lines", [0], _fill_counter) as counter, _count_user_lines(counter):
        yield counter


@contextlib.contextmanager
def _count_user_lines(counter):
    def local(frame, event, arg):
        if event == "line":
            counter[0] += 1
        return local

    def tracer(frame, event, arg):
        return local if is_user_file(frame.f_code.co_filename) else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield counter
    finally:
        sys.settrace(previous)
