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
import copy
import functools
import os
import sys
import traceback
import warnings

from .recording.active import active_membrane

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


# The failures of the check call in progress (set by `check` around its body). A failure raised in
# the check's code while the student's code is calling it (a hook, a harness function, an engine
# step the student drives) reaches the student's code first, which could catch it and carry on: the
# check remembers it here, and the call fails with it all the same.
_FAILURES: list | None = None


def fail(message: str):
    if _FAILURES is not None and not _FAILURES:
        _FAILURES.append(message)
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


# ---------------------------------------------------------------------------------------------
# The check's inputs and the student's results: credit needs the student's own computation
# ---------------------------------------------------------------------------------------------
#
# The student's code can change what it is handed (a list appended to, a config's field set, a
# tensor written into, a request's fields rewritten through the grader's own object), so an
# expected value computed afterwards from those objects could be made to agree with a wrong
# answer. So: every expected value comes from the grader's own copy (`pristine`, made before the
# call, never handed over); what was handed over is held to that copy afterwards (`expect_unchanged`),
# and a result is compared by value, as plain data of exact types (`plain_int`, `plain_float`,
# `difference`): an object of the student's own class (through the grading membrane: a proxy)
# never answers for a value.

pristine = copy.deepcopy  # of the grader's own data only: the student's objects are never copied


def _numpy_scalars():
    import numpy as np

    ints = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
    return ints, (np.float16, np.float32, np.float64)


def plain_int(x):
    """`x` as a Python int when it is an integer of a plain type (int, a numpy integer, a 0-d integer
    tensor); None for anything else (a bool, a float, an object of the student's own class)."""
    t = type(x)
    if t is int:
        return x
    ints, _ = _numpy_scalars()
    if t in ints:
        return int(x)
    import torch

    if t is torch.Tensor and x.dim() == 0 and not x.is_floating_point() and not x.is_complex() \
            and x.dtype is not torch.bool:
        return int(x.item())
    return None


def plain_float(x):
    """`x` as a Python float when it is a number of a plain type (float, int, a numpy number); None
    for anything else (a bool, a string, an object of the student's own class)."""
    t = type(x)
    if t is float or t is int:
        return float(x)
    ints, floats = _numpy_scalars()
    if t in ints or t in floats:
        return float(x)
    return None


def is_tensor(x) -> bool:
    """A torch.Tensor itself (no subclass, no object of the student's own class)."""
    import torch

    return type(x) is torch.Tensor


def _fields(obj) -> dict:
    """The state of one of the grader's objects (a course_lib dataclass, a __slots__ class, a namespace)."""
    state = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                state[name] = getattr(obj, name)
    return state


_PLAIN_KEYS = (type(None), bool, int, float, str, bytes)


def _plain_key(k) -> bool:
    """A dict key or set item of plain data (comparing it asks nobody anything)."""
    return type(k) in _PLAIN_KEYS or (type(k) in (tuple, frozenset) and all(_plain_key(x) for x in k))


def _is_plain(x, depth: int = 0) -> bool:
    t = type(x)
    return t in _PLAIN_KEYS or (t in (list, tuple) and depth < 4 and all(_is_plain(y, depth + 1) for y in x))


def show(value, limit: int = 80) -> str:
    """`value` for a message, without asking a student object anything (its repr is its code's)."""
    from .membrane import is_proxy

    if _is_plain(value):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "..."
    if is_tensor(value):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {list(value.shape)}"
    if is_proxy(value):
        return "an object of your code's own class"
    return f"a {type(value).__name__} object"


def _described(value) -> str:
    """"a list ([5, 6])", "an object of your code's own class": its kind, and its value when that is data."""
    return f"{kind_of(value)} ({show(value)})" if _is_plain(value) or is_tensor(value) else kind_of(value)


def kind_of(value) -> str:
    from .membrane import is_proxy

    if is_proxy(value):
        return "an object of your code's own class"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _tensor_difference(got, want, where: str) -> str | None:
    import torch

    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        return (f"{where} is a {str(got.dtype).replace('torch.', '')} tensor of shape {list(got.shape)}, "
                f"expected {str(want.dtype).replace('torch.', '')} of shape {list(want.shape)}")
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.is_floating_point() or got.is_complex():
        nan = want.isnan()  # NaN where NaN was, and every other value equal (inf included)
        same = torch.equal(got.isnan(), nan) and torch.equal(torch.where(nan, 0, got), torch.where(nan, 0, want))
    else:
        same = torch.equal(got, want)
    if same:
        return None
    changed = (got != want) & ~(got.isnan() & want.isnan()) if got.is_floating_point() else got != want
    first = changed.nonzero()[0].tolist()
    return (f"{where}[{', '.join(map(str, first))}] is {got[tuple(first)].item()!r}, it was "
            f"{want[tuple(first)].item()!r}")


def difference(got, want, where: str = "it", depth: int = 0) -> str | None:
    """None when `got` equals `want` as plain data: the same exact types all the way down (a float is
    not an int, a tuple not a list, a proxy or a subclass of the student's never a value) and equal
    values (floats exactly, NaN equal to NaN; tensors in dtype, shape and every element). Else the
    first difference, in words ("it[2] is 5, expected 6"). `want` is the grader's own data; nothing
    of `got` is asked a question (a student object is compared by identity only)."""
    import enum
    import types
    from collections import OrderedDict, deque

    import numpy as np

    tg, tw = type(got), type(want)
    if got is want:
        return None
    if depth > 40:
        return f"{where} is nested too deeply"
    if tg is not tw:
        return f"{where} is {_described(got)}, expected {_described(want)}"
    if want is None or tw in (bool, int, str, bytes):
        return None if got == want else f"{where} is {show(got)}, expected {show(want)}"
    if tw is float:
        same = got == want or (got != got and want != want)
        return None if same else f"{where} is {got!r}, expected {want!r}"
    if tw in (list, tuple, deque):
        if len(got) != len(want):
            return f"{where} has {len(got)} items, expected {len(want)} ({show(want)})"
        for i, (g, w) in enumerate(zip(got, want)):
            found = difference(g, w, f"{where}[{i}]", depth + 1)
            if found:
                return found
        return None
    if tw in (dict, OrderedDict, set, frozenset):
        odd = next((k for k in got if not _plain_key(k)), None)
        if odd is not None:
            return f"{where} holds a key that is {kind_of(odd)}, expected plain data"
        if set(got) != set(want):
            return f"{where} has the keys {show(sorted(got, key=repr))}, expected {show(sorted(want, key=repr))}"
        if tw in (set, frozenset):
            return None
        for k, w in want.items():
            found = difference(got[k], w, f"{where}[{k!r}]", depth + 1)
            if found:
                return found
        return None
    if is_tensor(want):
        return _tensor_difference(got, want, where)
    if isinstance(want, (np.ndarray, np.generic)):
        same = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(
            got, want, equal_nan=want.dtype.kind in "fc")
        return None if same else f"{where} is {show(got)}, expected {show(want)}"
    if isinstance(want, enum.Enum):
        return None if got is want else f"{where} is {got}, expected {want}"
    if tw is types.MethodType:  # a hook bound to one of the grader's objects (deep-copied with it)
        if got.__func__ is not want.__func__:
            return f"{where} was replaced"
        return difference(got.__self__, want.__self__, f"{where}.__self__", depth + 1)
    if callable(want) or isinstance(want, type):  # functions and hooks: the same object, or replaced
        return f"{where} was replaced"
    mine, theirs = _fields(got), _fields(want)
    if not theirs:  # nothing to compare but identity, and it is not the same object
        return f"{where} was replaced"
    for name in sorted(set(mine) | set(theirs)):
        if name not in theirs:
            return f"{where} gained an attribute {name!r}"
        if name not in mine:
            return f"{where} lost its attribute {name!r}"
        found = difference(mine[name], theirs[name], f"{where}.{name}", depth + 1)
        if found:
            return found
    return None


def expect_unchanged(shown: str, what: str, handed, kept) -> None:
    """Fail unless `handed` (what the student's code was given) still equals `kept` (the grader's
    own copy of it, made before the call): a function must not change the check's inputs."""
    found = difference(handed, kept, f"`{what}`")
    if found:
        found = found.replace(" expected ", " it was ", 1)
        fail(f"{shown} changed the check's input `{what}` ({found}): your code must leave what it is given as it "
             f"was (compute on a copy); the check's expected answer comes from its own copy of `{what}`, never "
             "from what your code hands back")


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


# The membrane of the check call in progress (autograder.recording.active, a context variable): set
# by `check` while its body runs on a recorded or replayed adapter, so that the hooks below note or
# read back what they saw.


@contextlib.contextmanager
def _hooked(kind: str, value, fill):
    """Around a hook's block: in RECORD mode note `value` when the block ends, in REPLAY mode
    `fill` it from the record (the student's code never runs in the grader, so it saw nothing)."""
    m = active_membrane()
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
    """Record (module name, function name) of every call into code from `modules` in the block (modules,
    or single functions: autograder.call_tripwire)."""
    m = active_membrane()
    if m is not None and m.mode == "replay":
        with _hooked("watch", [], _fill_list) as hits:
            yield hits
        return
    with _hooked("watch", [], _fill_list) as hits, _watch_calls(modules, hits):
        yield hits


@contextlib.contextmanager
def _watch_calls(modules, hits):
    # Trip wires in the modules' functions, not a profile hook: a hook runs a Python callback on every
    # call and return of all the block's code and doubled the recorded checks (autograder.call_tripwire).
    from .call_tripwire import tripwires

    with tripwires(modules, hits):
        yield hits


@contextlib.contextmanager
def forbid_calls(name: str, modules, enabled: bool = True):
    """Fail if code from `modules` (the reference of this exercise) runs inside the block: it
    catches a student function that merely calls the reference, however it was imported."""
    if not enabled:
        yield
        return
    hits = []
    try:
        with watch_calls(modules) as hits:
            yield
    finally:
        # Read once the watch has closed: replaying a record, that is when the calls are filled in from it
        # (read inside, a function that merely calls the reference passed the grader's replay). Even when
        # the student's code then crashed: this is the reason to report.
        if hits:
            module, func = hits[0]
            fail(f"{name} {REFERENCE_MESSAGE} (it calls {module}.{func})")


@contextlib.contextmanager
def count_user_lines():
    """Count the Python lines the student's code executes in the block (loops show up as growth)."""
    m = active_membrane()
    if m is not None and m.mode == "replay":
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

                handled = through_membrane(name, impl, seed, refuse, run, fail=fail,
                                           describe_exception=describe_exception, is_user_file=is_user_file)
                if handled:
                    return None
                reject_reference(name, impl, forbidden(), allowed_bases())
            run(impl, seed, _allow_reference)
            return None  # never a value: nbgrader would read a number as partial credit

        def run(impl, seed, _allow_reference=False):
            global _FAILURES
            previous, _FAILURES = _FAILURES, []
            try:
                with check_environment():
                    try:
                        body(impl, seed, _allow_reference)
                    except (NotImplementedError, _AssertionError):
                        raise
                    except Exception as exc:  # noqa: BLE001
                        fail(f"{name}: {describe_exception(exc)}")
                if _FAILURES:  # the body went on: the failure was caught on its way through the student's code
                    raise _AssertionError(f"{_FAILURES[0]} (your code caught this failure of the check and went "
                                          "on; a failure of the check stands whatever your code does with it)")
            finally:
                _FAILURES = previous

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


class RunnerLedger:
    """What the engine's own runner did, kept by the check: every token it sampled for each request,
    in order, and every preemption in the scheduler outputs it executed.

    A student's piece plugged into the engine is handed the engine's requests (and its kv manager),
    so it can rewrite a request's output list, status or counters; the runner it is never handed.
    The verdict therefore holds the requests to this ledger (`expect_requests_match`): a request
    made to look finished, or given tokens the model never produced, fails."""

    def __init__(self, engine):
        self.tokens: dict[str, list[int]] = {}
        self.preempted: dict[str, int] = {}
        execute = engine.runner.execute

        def execute_and_note(out):
            for rid in out.preempted:
                if type(rid) is str:
                    self.preempted[rid] = self.preempted.get(rid, 0) + 1
            sampled = execute(out)
            for rid, token in sampled.items():  # before the scheduler's update sees (and could change) them
                self.tokens.setdefault(rid, []).append(int(token))
            return sampled

        engine.runner.execute = execute_and_note

    def expect_requests_match(self, engine, who: str, preemptions: bool = False) -> None:
        """Every request's output tokens (and, if asked, its preemption count) are the ledger's."""
        for rid, request in engine.requests.items():
            want = self.tokens.get(rid, [])
            found = difference(request.output_token_ids, want, "its output_token_ids")
            if found:
                fail(f"{who}: request {rid}: {found.replace(' expected ', ' but the engine produced ', 1)} "
                     f"({len(want)} token(s) sampled by the engine's model for it): a request's tokens come only "
                     "from the engine's steps; your code must not change a request's output list, status or "
                     "counters itself")
            if preemptions:
                n = self.preempted.get(rid, 0)
                expect(type(request.num_preemptions) is int and request.num_preemptions == n,
                       lambda: f"{who}: request {rid} counts {show(request.num_preemptions)} preemption(s), but the "
                               f"scheduler's outputs preempted it {n} time(s): a preemption is counted once, by the "
                               "scheduler that makes it; your code must not change a request's counters itself")
