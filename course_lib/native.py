"""C code compiled on first use: how course_lib builds, caches and loads its small C kernels.

Each source is compiled once per scalar type (SCALAR=float / double) with the system C compiler
(`$CC`, else `cc`), in about a second, for the machine it runs on (-march=native), and cached
under `$COURSE_LIB_KERNEL_CACHE` (default `~/.cache/course_lib/kernels`; a read-only
`$COURSE_LIB_KERNEL_PREBUILT` is looked in first: kernel_cache.py), keyed by the sources,
the flags and the CPU. No compiler, or a failed build: `load` raises a RuntimeError that says
why, remembered so later calls fail fast, and `available` reports it, so callers can fall back
to their torch code.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import torch

from .kernel_cache import cache_dir, prebuilt_dir

# (scalar, its exp, its ctypes type): float uses cpu_decode.c's exp_float, which vectorises
DTYPES = {torch.float32: ("float", "exp_float", ctypes.c_float), torch.float64: ("double", "exp", ctypes.c_double)}
# -fno-trapping-math and -fno-math-errno (PyTorch builds with both) change no result: they let
# the compiler vectorise loops with float-to-int conversions and inline sqrt.
FLAGS = ("-O3", "-funroll-loops", "-fPIC", "-shared", "-fopenmp-simd", "-std=c99", "-pthread", "-fno-trapping-math",
         "-fno-math-errno")
# Tuned for this CPU (AVX2 and FMA where it has them: ~1.5x faster than the x86-64 baseline
# here); compilers that refuse the flag build without it. The cache key includes the CPU, so a
# home folder shared by different machines never loads a library built for another CPU.
NATIVE = ("-march=native",)




def _cpu() -> str:
    """What identifies this CPU for -march=native: its architecture and feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def compile_library(source: Path, scalar: str, exp: str, includes: tuple[Path, ...] = ()) -> Path:
    """Path of the shared library built from `source` for one scalar type (which may #include the
    files in `includes`, found by their folder), compiled unless already cached."""
    compiler = os.environ.get("CC") or "cc"
    defines = (f"-DSCALAR={scalar}", f"-DEXP={exp}")
    include_flags = tuple(dict.fromkeys(f"-I{p.parent}" for p in includes))
    # The includes' contents are hashed, not where they sit: the same build has the same key whether
    # course_lib lives in a checkout or at the sandbox's /course (which loads the grader's build).
    recipe = repr((compiler, FLAGS, NATIVE, defines, tuple(p.name for p in includes), _cpu())).encode()
    key = hashlib.sha256(b"".join(p.read_bytes() for p in (source, *includes)) + recipe).hexdigest()[:16]
    name = f"{source.stem}_{scalar}_{key}.so"
    prebuilt = prebuilt_dir()
    if prebuilt is not None and (prebuilt / name).exists():  # built by whoever mounted it (the grader)
        return prebuilt / name
    target = cache_dir() / name
    if target.exists():
        return target
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler: {compiler!r} is not on PATH (set $CC to one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        for extra in (NATIVE, ()):
            cmd = [compiler, *FLAGS, *defines, *include_flags, *extra, str(source), "-o", str(built), "-lm"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode == 0:
                break
        else:
            raise RuntimeError(f"compiling {source.name} failed: {' '.join(cmd)}\n{result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent build never sees half a file
    return target


class Kernel:
    """One C source, loaded per torch dtype on first use.

    `what` names it in errors ("the cpu attention backend"); `declare(lib, c_scalar)` sets the
    argument types of its functions. Tests swap `source`, or reset `libraries` and `error`."""

    def __init__(self, source: Path, what: str, declare: Callable, includes: tuple[Path, ...] = ()):
        self.source, self.what, self.declare, self.includes = source, what, declare, includes
        self.libraries: dict[torch.dtype, ctypes.CDLL] = {}
        self.error: str | None = None

    def load(self, dtype: torch.dtype) -> ctypes.CDLL:
        """The library for `dtype`; ValueError for an unsupported dtype, RuntimeError (saying why)
        when it cannot be built."""
        if dtype not in DTYPES:
            names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
            raise ValueError(f"{self.what} supports {names}, not {str(dtype).removeprefix('torch.')}")
        if dtype in self.libraries:
            return self.libraries[dtype]
        if self.error is not None:
            raise RuntimeError(f"{self.what} is unavailable: {self.error}")
        scalar, exp, c_scalar = DTYPES[dtype]
        try:
            lib = ctypes.CDLL(str(compile_library(self.source, scalar, exp, self.includes)))
        except (OSError, RuntimeError) as err:
            self.error = str(err)
            raise RuntimeError(f"{self.what} is unavailable: {err}") from None
        self.declare(lib, c_scalar)
        self.libraries[dtype] = lib
        return lib

    def available(self, dtype: torch.dtype = torch.float32) -> tuple[bool, str]:
        """(True, "") when the library is built (or builds now) for `dtype`; else (False, the reason)."""
        try:
            self.load(dtype)
            return True, ""
        except RuntimeError as err:
            return False, str(err)
