"""What every check shares: failing with a useful message, refusing the reference, calling
student code safely, and watching what it calls.

A check is a plain function `check_<adapter>(impl, seed=0)` wrapped by `@check(...)`, which:

- refuses `impl` when it is (or is built from) course_lib's / the autograder's own implementation,
  unless the private flag `_allow_reference=True` is given (tests/test_autograder_checks.py only);
- runs the body with warnings silenced (nbgrader counts stderr output as a failure), one torch
  thread (fast and deterministic on small tensors) and the caller's RNG state preserved;
- turns an unexpected exception (a missing method, a wrong return type) into an AssertionError
  that says which adapter and what went wrong, and where in the student's code it was raised.

Checks never use the `assert` statement: it vanishes under `python -O`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
import warnings

REFERENCE_MESSAGE = "uses course_lib's reference implementation instead of your own"
AUTOGRADER_REFERENCE_MESSAGE = "uses the autograder's reference implementation instead of your own"

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


# ---------------------------------------------------------------------------------------------
# Failing
# ---------------------------------------------------------------------------------------------

_AssertionError = AssertionError  # bound at import; the grader's guard restores builtins first


def fail(message: str):
    raise _AssertionError(message)


def expect(condition, message) -> None:
    """Fail with `message` (a string, or a function returning one) unless `condition` holds."""
    if not condition:
        fail(message() if callable(message) else message)


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


# ---------------------------------------------------------------------------------------------
# Refusing the reference
# ---------------------------------------------------------------------------------------------


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


# The membrane of the check call in progress (autograder.membrane): set by `check` while its body
# runs on a recorded or replayed adapter, so that the hooks below note or read back what they saw.
_ACTIVE = None


@contextlib.contextmanager
def _hooked(kind: str, value, fill):
    """Around a hook's block: in RECORD mode note `value` when the block ends, in REPLAY mode
    `fill` it from the record (the student's code never runs in the grader, so it saw nothing)."""
    m = _ACTIVE
    if m is None:
        yield value
        return
    from .membrane import Divergence, RecordLimit

    try:
        yield value
    except (Divergence, RecordLimit, KeyboardInterrupt):
        raise
    except BaseException:
        fill(value, m.hook(kind, value if m.mode == "record" else None))
        raise
    fill(value, m.hook(kind, value if m.mode == "record" else None))


def _fill_list(target, recorded):
    if isinstance(recorded, list):
        target[:] = [tuple(x) if isinstance(x, (list, tuple)) else x for x in recorded]


def _fill_counter(target, recorded):
    if isinstance(recorded, list) and recorded and isinstance(recorded[0], int):
        target[0] = recorded[0]


@contextlib.contextmanager
def watch_calls(modules):
    """Record (module name, function name) of every call into code from `modules` in the block."""
    if _ACTIVE is not None and _ACTIVE.mode == "replay":
        with _hooked("watch", [], _fill_list) as hits:
            yield hits
        return
    with _hooked("watch", [], _fill_list) as hits, _watch_calls(modules, hits):
        yield hits


@contextlib.contextmanager
def _watch_calls(modules, hits):
    files = {}
    for mod in modules:
        path = getattr(mod, "__file__", None) or mod
        if path:
            files[os.path.abspath(path)] = getattr(mod, "__name__", path)

    def profiler(frame, event, arg):
        if event == "call":
            filename = frame.f_code.co_filename
            if filename in files and len(hits) < 1000:
                hits.append((files[filename], frame.f_code.co_name))

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        yield hits
    finally:
        sys.setprofile(previous)


@contextlib.contextmanager
def forbid_calls(name: str, modules, enabled: bool = True):
    """Fail if code from `modules` (the reference of this exercise) runs inside the block: it
    catches a student function that merely calls the reference, however it was imported."""
    if not enabled:
        yield
        return
    with watch_calls(modules) as hits:
        try:
            yield
        finally:
            if hits:  # even when the student's code then crashed: this is the reason to report
                module, func = hits[0]
                fail(f"{name} {REFERENCE_MESSAGE} (it calls {module}.{func})")


@contextlib.contextmanager
def count_user_lines():
    """Count the Python lines the student's code executes in the block (loops show up as growth)."""
    if _ACTIVE is not None and _ACTIVE.mode == "replay":
        with _hooked("lines", [0], _fill_counter) as counter:
            yield counter
        return
    with _hooked("lines", [0], _fill_counter) as counter, _count_user_lines(counter):
        yield counter


@contextlib.contextmanager
def _count_user_lines(counter):
    def local(frame, event, arg):
        if event == "line":
            counter[0] += 1
        return local

    def tracer(frame, event, arg):
        return local if is_user_file(frame.f_code.co_filename) else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield counter
    finally:
        sys.settrace(previous)


# ---------------------------------------------------------------------------------------------
# The decorator
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def check_environment():
    """Warnings off, one torch thread, the caller's RNG state preserved."""
    import torch

    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                yield
        finally:
            torch.set_num_threads(threads)


def check(name: str, forbidden=lambda: (), allowed_bases=lambda: ()):
    """Wrap `body(impl, seed, allow_reference)` into `check_<name>(impl, seed=0)`.
    `forbidden` / `allowed_bases` are thunks so that importing a check module stays cheap."""

    def decorate(body):
        def refuse(raw):
            reject_reference(name, raw, forbidden(), allowed_bases())

        @functools.wraps(body)
        def wrapper(impl, seed: int = 0, *, _allow_reference: bool = False):
            if impl is None:
                fail(f"{name} is None: define it in the solution cell above (and run that cell)")
            if not isinstance(seed, int):
                fail(f"seed must be an int, got {seed!r}")
            if not _allow_reference:
                from .record import through_membrane

                handled = through_membrane(wrapper, name, impl, seed, refuse, run)
                if handled:
                    return None
                reject_reference(name, impl, forbidden(), allowed_bases())
            run(impl, seed, _allow_reference)
            return None  # never a value: nbgrader would read a number as partial credit

        def run(impl, seed, _allow_reference=False):
            with check_environment():
                try:
                    body(impl, seed, _allow_reference)
                except (NotImplementedError, _AssertionError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    fail(f"{name}: {describe_exception(exc)}")

        wrapper.exercise = name
        wrapper.run_body = run
        return wrapper

    return decorate


def drive(engine, who: str, max_steps: int = 2000, on_step=None) -> None:
    """Step `engine` until every request is finished; a stall or an engine error is a failure."""
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            return
        try:
            engine.step()
        except (NotImplementedError, _AssertionError):
            raise
        except Exception as exc:  # noqa: BLE001
            hint = ""
            if type(exc).__name__ == "OutOfPages":
                hint = (" The pool ran out of pages: before allocating, make room (the scheduler "
                        "preempts the youngest request with self._make_room) or check kv.can_allocate.")
            fail(f"{who}: the engine failed mid-run with {describe_exception(exc)}.{hint}")
        if on_step is not None:
            on_step(engine)
    stuck = [r.request_id for r in engine.requests.values() if not r.is_finished]
    fail(f"{who}: {len(stuck)} request(s) ({', '.join(stuck[:5])}) were still unfinished after "
         f"{max_steps} engine steps: requests are being lost or never retired")
