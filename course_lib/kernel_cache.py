"""Where course_lib's compiled C kernels live (torch-free, so the grader's sandbox code can ask).

`cache_dir()`: where `native.compile_library` writes and finds them, `$COURSE_LIB_KERNEL_CACHE` or
`~/.cache/course_lib/kernels`. `prebuilt_dir()`: a read-only folder of kernels built elsewhere,
`$COURSE_LIB_KERNEL_PREBUILT`, looked in first: the autograder's sandbox mounts the grader's own
cache there, so a notebook's kernel loads the grader's build instead of compiling it again in its
private /tmp (about 2 s a notebook). Both are keyed by sources, flags and CPU (native.py), so a
library from the wrong build is never picked.
"""
from __future__ import annotations

import os
from pathlib import Path

PREBUILT_ENV = "COURSE_LIB_KERNEL_PREBUILT"


def cache_dir() -> Path:
    return Path(os.environ.get("COURSE_LIB_KERNEL_CACHE") or Path.home() / ".cache" / "course_lib" / "kernels")


def prebuilt_dir() -> Path | None:
    folder = os.environ.get(PREBUILT_ENV)
    return Path(folder) if folder else None
