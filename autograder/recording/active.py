"""The membrane of the check call in progress.

`autograder.record.through_membrane` activates it while a check's body runs on a recorded or
replayed adapter; the checks' hooks (`autograder._checking.watch_calls`, `count_user_lines`) read it
to note, or read back, what they saw. A context variable, not a module global: it belongs to the
check call's own thread (a thread the student's code starts sees none, as the membrane refuses its
proxies there), and ends with the call even when the call raises.

While a membrane is active the garbage collector leaves alone every object that existed before
(`gc.freeze`, undone when the outermost activation ends): a crossing allocates a few objects, and
each of the collector's full passes used to walk the whole process (torch's ~870,000 objects; in
the replay also the parsed record), which made a crossing five times dearer (36 us instead of 7.5)
and was most of a recorded check's time. Objects made during the check are collected as usual;
garbage that already existed waits until the check ends.
"""
from __future__ import annotations

import contextlib
import contextvars
import gc
import threading

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("autograder_active_membrane", default=None)
_FROZEN = {"depth": 0, "mine": False}  # activations with a membrane in progress, and whether we froze
_LOCK = threading.Lock()


def active_membrane():
    """The membrane of the check call in progress on this thread, or None."""
    return _ACTIVE.get()


def _freeze() -> None:
    with _LOCK:
        _FROZEN["depth"] += 1
        if _FROZEN["depth"] == 1:
            # Frozen by someone else already (a notebook may call gc.freeze itself): leave it to them.
            _FROZEN["mine"] = gc.get_freeze_count() == 0
            if _FROZEN["mine"]:
                gc.freeze()


def _thaw() -> None:
    with _LOCK:
        _FROZEN["depth"] -= 1
        if _FROZEN["depth"] == 0 and _FROZEN["mine"]:
            _FROZEN["mine"] = False
            gc.unfreeze()


@contextlib.contextmanager
def activated(membrane):
    """`membrane` is the active one inside the block (None: no membrane), the previous one after it."""
    token = _ACTIVE.set(membrane)
    if membrane is not None:
        _freeze()
    try:
        yield membrane
    finally:
        if membrane is not None:
            _thaw()
        _ACTIVE.reset(token)
