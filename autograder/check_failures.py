"""How a check fails: an AssertionError whose message says what went wrong, naming the broken rule
(`broke`) and, for an exception of the student's code, where in their code it was raised. Checks
never use the `assert` statement: it vanishes under `python -O`."""
from __future__ import annotations

import contextlib
import contextvars
import traceback

from .user_code import is_user_file

_AssertionError = AssertionError  # bound at import; the grader's guard restores builtins first


# The failures of the check call in progress (`collecting_failures`, around the check's body). A failure
# raised in the check's code while the student's code is calling it (a hook, a harness function, an
# engine step the student drives) reaches the student's code first, which could catch it and carry on:
# the check remembers it here, and the call fails with it all the same. A context variable: it belongs
# to the check call's thread and ends with the call, as the active membrane does.
_FAILURES: contextvars.ContextVar = contextvars.ContextVar("autograder_check_failures", default=None)


@contextlib.contextmanager
def collecting_failures():
    """The list of this check call's failures (the first one only), empty until one is raised."""
    failures: list[str] = []
    token = _FAILURES.set(failures)
    try:
        yield failures
    finally:
        _FAILURES.reset(token)


def fail(message: str):
    failures = _FAILURES.get()
    if failures is not None and not failures:
        failures.append(message)
    raise _AssertionError(message)


def broke(rule: str, message: str):
    """Fail naming the rule the student's code broke, as the exercise's collapsed block "The rules the
    check holds you to" names it (`**<rule>**`): a student who designed it differently knows which rule
    to open. tests/test_rules_blocks.py holds every rule a check names to its notebook's block."""
    fail(f'Rule "{rule}": {message}')


def expect(condition, message, rule: str | None = None) -> None:
    """Fail with `message` (a string, or a function returning one) unless `condition` holds; with `rule`,
    the failure names the broken rule (see `broke`)."""
    if not condition:
        text = message() if callable(message) else message
        if rule is None:
            fail(text)
        broke(rule, text)


def describe_exception(exc: BaseException) -> str:
    """`KeyError: 7 (raised in your code: free, line 12: `del self._free[page]`)`."""
    where = getattr(exc, "_autograder_where", None)
    if isinstance(where, str) and where:  # replayed from a record: described where it was raised
        return where
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if is_user_file(f.filename)]
    if mine:
        f = mine[-1]
        line = f" `{f.line.strip()}`" if f.line else ""
        text += f" (raised in your code: {f.name}, line {f.lineno}:{line})"
    return text


def call(what: str, fn, *args, **kwargs):
    """Call student code; any exception other than NotImplementedError becomes a clear failure."""
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, _AssertionError):
        raise
    except Exception as exc:  # noqa: BLE001 - anything the student's code raises
        fail(f"{what} raised {describe_exception(exc)}")


def same_float(a, b, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))
