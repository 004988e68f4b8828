"""Refusing the reference: no credit for an answer that is, subclasses, wraps or copies course_lib's or
the autograder's own code (where a function or a class's methods were defined says whose code it is).
"""
from __future__ import annotations

import functools
import os

from .check_failures import fail
from .user_code import _AUTOGRADER_DIR, _course_lib_dir

REFERENCE_MESSAGE = "uses course_lib's reference implementation instead of your own"
AUTOGRADER_REFERENCE_MESSAGE = "uses the autograder's reference implementation instead of your own"


def _origin(module_name: str | None, filename: str | None) -> str | None:
    """'course_lib' / 'autograder' when code comes from there (mutants and references included)."""
    if module_name:
        root = module_name.split(".")[0]
        if root in ("course_lib", "autograder"):
            return root
    if filename:
        path = os.path.abspath(filename)
        if path.startswith(_course_lib_dir() + os.sep):
            return "course_lib"
        if path.startswith(_AUTOGRADER_DIR + os.sep):
            return "autograder"
    return None


def _function_origin(obj) -> str | None:
    obj = getattr(obj, "__func__", obj)  # bound methods, classmethods, staticmethods
    if isinstance(obj, property):
        return _function_origin(obj.fget) if obj.fget else None
    if isinstance(obj, functools.partial):
        return _function_origin(obj.func)
    code = getattr(obj, "__code__", None)
    return _origin(getattr(obj, "__module__", None), code.co_filename if code else None)


def reject_reference(name: str, impl, forbidden=(), allowed_bases=()) -> None:
    """Fail if `impl` is, subclasses, wraps or copies code from course_lib or the autograder."""
    messages = {"course_lib": REFERENCE_MESSAGE, "autograder": AUTOGRADER_REFERENCE_MESSAGE}
    for ref in forbidden:
        if impl is ref or (isinstance(impl, type) and isinstance(ref, type) and issubclass(impl, ref)):
            fail(f"{name} {REFERENCE_MESSAGE} ({ref.__module__}.{ref.__qualname__})")
    if isinstance(impl, functools.partial):
        impl = impl.func
    if isinstance(impl, type):
        for klass in impl.__mro__:
            if klass is object or klass in allowed_bases:
                continue
            origin = _origin(klass.__module__, None)
            if origin:
                fail(f"{name} {messages[origin]} (it is built on {klass.__module__}.{klass.__qualname__})")
            for attr, value in vars(klass).items():
                origin = _function_origin(value)
                if origin:
                    fail(f"{name} {messages[origin]} (its {attr} comes from {origin})")
        return
    if hasattr(impl, "__code__") or hasattr(impl, "__func__"):
        origin = _function_origin(impl)
    elif callable(impl):  # an object with __call__: judge its class
        reject_reference(name, type(impl), forbidden, allowed_bases)
        return
    else:
        origin = _origin(getattr(impl, "__module__", None), None)
    if origin:
        fail(f"{name} {messages[origin]}")
