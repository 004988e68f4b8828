"""Exceptions as data: the student's exception recorded as its class names, message and where it
was raised, and rebuilt on the grader's side as a course_lib or builtin class (or a subclass named
like the student's own) that carries the same description."""
from __future__ import annotations

import builtins

from .class_names import course_class as _course_class, load_course_class as _load_course_class
from .errors import Divergence


def describe_plainly(exc: BaseException) -> str:
    """An exception's type and message (the checks hand in a describer that also says where in the
    student's code it was raised: `autograder._checking.describe_exception`)."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def exception_info(exc: BaseException, describe_exception=describe_plainly) -> dict:
    bases = []
    for klass in type(exc).__mro__:
        spec = _course_class(klass)
        if spec:
            bases.append(spec)
        elif klass.__module__ == "builtins":
            bases.append(f"builtins:{klass.__name__}")
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student's __str__ may raise
        message = "<unprintable>"
    return {"type": type(exc).__name__, "bases": bases[:12], "msg": message[:4000],
            "where": describe_exception(exc)[:4000]}


_DYNAMIC: dict[tuple, type] = {}


def rebuild_exception(info) -> BaseException:
    """The student's exception as the grader's side sees it: a course_lib or builtin class, or a
    subclass named like the student's own class on the nearest course_lib / builtin base."""
    if not isinstance(info, dict):
        return Divergence("a malformed exception in the record")
    name, msg = str(info.get("type", "Exception"))[:100], str(info.get("msg", ""))[:4000]
    base = Exception
    for spec in info.get("bases", []) if isinstance(info.get("bases"), list) else []:
        if not isinstance(spec, str):
            continue
        if spec.startswith("builtins:"):
            cand = getattr(builtins, spec.split(":", 1)[1], None)
        else:
            try:
                cand = _load_course_class(spec)
            except Divergence:
                cand = None
        if isinstance(cand, type) and issubclass(cand, BaseException) and cand not in (KeyboardInterrupt,):
            base = cand
            break
    if base.__name__ == name:
        klass = base
    else:
        key = (name, base)
        if key not in _DYNAMIC:
            _DYNAMIC[key] = type(name, (base,), {"__module__": "student"})
        klass = _DYNAMIC[key]
    try:
        exc = klass.__new__(klass)
        BaseException.__init__(exc, msg)
    except Exception:  # noqa: BLE001
        exc = Exception(msg)
    try:
        exc._autograder_where = str(info.get("where", ""))
    except Exception:  # noqa: BLE001
        pass
    return exc
