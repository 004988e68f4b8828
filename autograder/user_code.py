"""Which code is the student's: a frame's file is the student's unless it lies in a library folder
(Python's own, course_lib, the autograder, torch, numpy, IPython, pytest, site-packages). The
autograder's reference and mutants folders count as the student's: the tests hand them in as answers.
Failures name the student's line from it (`describe_exception`), and the line counter counts only it."""
from __future__ import annotations

import functools
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_AUTOGRADER_DIR = _HERE
# Code in these folders counts as the student's (tests run the references and mutants from there).
_USER_SUBDIRS = tuple(os.path.join(_HERE, d) + os.sep for d in ("reference", "mutants"))


@functools.lru_cache(maxsize=None)
def _course_lib_dir() -> str:
    import course_lib

    return os.path.dirname(os.path.abspath(course_lib.__file__))


@functools.lru_cache(maxsize=None)
def _library_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(os.__file__), _course_lib_dir(), _AUTOGRADER_DIR}
    for name in ("torch", "numpy", "IPython", "ipykernel", "_pytest", "pluggy"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.add(os.path.dirname(os.path.abspath(mod.__file__)))
    for p in sys.path:
        if p.endswith("site-packages"):
            dirs.add(p)
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True for code the student wrote (a notebook cell, their own module), False for libraries."""
    if not filename:
        return False
    if filename.startswith(_USER_SUBDIRS):
        return True
    if filename.startswith("<frozen") or filename.startswith("<built-in"):
        return False
    return not os.path.abspath(filename).startswith(_library_dirs())
