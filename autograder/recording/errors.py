"""What stops a recording or its replay: control-flow exceptions no check can catch by mistake."""
from __future__ import annotations

MAX_EVENTS = 400_000  # per check call: a record longer than this is cut (and fails in replay)


class Divergence(BaseException):
    """The record does not answer the question the check asks (forged, truncated or nondeterministic)."""


class RecordLimit(BaseException):
    """A check call produced more events than MAX_EVENTS."""


class Refused(TypeError):
    """What a callback returned may not cross to the student's code (autograder.callbacks.hold_refusal)."""
