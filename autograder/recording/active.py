"""The membrane of the check call in progress.

`autograder.record.through_membrane` activates it while a check's body runs on a recorded or
replayed adapter; the checks' hooks (`autograder._checking.watch_calls`, `count_user_lines`) read it
to note, or read back, what they saw. A context variable, not a module global: it belongs to the
check call's own thread (a thread the student's code starts sees none, as the membrane refuses its
proxies there), and ends with the call even when the call raises.
"""
from __future__ import annotations

import contextlib
import contextvars

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("autograder_active_membrane", default=None)


def active_membrane():
    """The membrane of the check call in progress on this thread, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def activated(membrane):
    """`membrane` is the active one inside the block (None: no membrane), the previous one after it."""
    token = _ACTIVE.set(membrane)
    try:
        yield membrane
    finally:
        _ACTIVE.reset(token)
