"""The classes a record may name, by "module:QualName": course_lib's own (dataclasses, enums,
exceptions) among modules the grader has already imported, and a fixed list of standard classes a
student object may show to isinstance(). A name read from a record is only looked up, never imported."""
from __future__ import annotations

import collections
import decimal
import fractions
import random
import sys

from .errors import Divergence


def course_class(obj_type) -> str | None:
    mod = getattr(obj_type, "__module__", "") or ""
    if mod == "course_lib" or mod.startswith("course_lib."):
        return f"{mod}:{obj_type.__qualname__}"
    return None


def load_course_class(spec):
    """A course_lib class the grader has already imported, by "module:Name" (the record names it:
    nothing is ever imported for it, only looked up)."""
    if not isinstance(spec, str) or ":" not in spec or len(spec) > 200:
        raise Divergence(f"bad class name in the record: {str(spec)[:80]!r}")
    mod, qual = spec.split(":", 1)
    if not (mod == "course_lib" or mod.startswith("course_lib.")) or "." in qual:
        raise Divergence(f"the record names a class outside course_lib: {spec!r}")
    klass = getattr(sys.modules.get(mod), qual, None)
    if not (isinstance(klass, type) and klass.__module__ == mod and klass.__qualname__ == qual):
        raise Divergence(f"the record names an unknown class {spec!r}")
    return klass


# Classes of the standard library a student object may show as its class to isinstance() in the
# grader (harmless: every use of the object still goes through the record), by exact name.
_SHOWN_CLASSES = {f"{k.__module__}:{k.__qualname__}": k for k in (
    random.Random, collections.OrderedDict, collections.defaultdict, collections.Counter, collections.deque,
    fractions.Fraction, decimal.Decimal)}


def shown_class(obj) -> str | None:
    klass = type(obj)
    spec = f"{getattr(klass, '__module__', '')}:{getattr(klass, '__qualname__', '')}"
    if spec in _SHOWN_CLASSES or course_class(klass):
        return spec
    return None


def load_shown_class(spec):
    if not isinstance(spec, str):
        return None
    if spec in _SHOWN_CLASSES:
        return _SHOWN_CLASSES[spec]
    try:
        return load_course_class(spec)
    except Divergence:
        return None


def class_name(klass) -> str:
    """The student's class's name, as the messages show it (read without running its code)."""
    try:
        name = type.__dict__["__qualname__"].__get__(klass)
    except Exception:  # noqa: BLE001
        name = "?"
    return str(name)[:100]
