"""Notice calls into given modules' code without a profiler: trip wires in their functions.

`forbid_calls` must learn whether a student's function ran the exercise's reference (course_lib's
counterpart), however the student reached it. A profile hook (`sys.setprofile`) sees every call,
but it runs a Python callback on each call and return of *all* code in the block: it doubled the
recorded checks (check_StudentBlockPool over its three seeds: 1.0 s with the hook, 0.5 s without).

A trip wire costs nothing until it fires: for the block, every function whose code lives in one of
the modules' files gets a new `__code__`, a trampoline that notes (module, function name) and calls
a copy of the original. The function *object* is changed, so every reference to it trips the wire:
a name imported before (`from course_lib.kv.slots import slot_mapping as sm`), a bound method of an
instance made earlier, a functools.partial. The wires are laid on

- the modules' functions, and the functions, static and class methods and property accessors of
  the classes defined in them (nested classes too);
- every other live function object whose code comes from those files (closures a reference factory
  returned, the function inside a decorator), found once per set of files by a scan of the garbage
  collector's objects (about 50 ms with torch loaded).

A function made from those files *during* the block is made by code that already tripped a wire.
A module's code run a second time (`runpy.run_path` of its file, `importlib.reload`, `exec` of its
code) makes new function objects no wire was laid on: an audit hook (`sys.addaudithook`, which no
code can remove) sees every `exec`, notes a watched file's code run inside a block as a call, and
remembers files whose module code ran twice, whose live functions a later block looks up again
(the scan then includes the objects `gc.freeze()` hid). Blocks nest (each notes what runs inside
it). Like the profile hook it replaces, it notes calls in every thread, and is a review aid a
determined student can undo (restoring `__code__`), not a security boundary.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import itertools
import os
import sys
import types

MAX_HITS = 1000
TRAMPOLINE_FILE = "<call_tripwire>"
_serial = itertools.count()
_watchers: list[tuple[dict, dict, list]] = []  # open blocks: ({file: module}, {file: module, direct calls}, hits)
_wired: dict[int, tuple[types.FunctionType, types.CodeType, str, int]] = {}  # id -> (fn, code, key, users)
_copies: set[int] = set()  # the originals' stand-ins the trampolines call: never wired themselves
_prepared: dict[int, tuple] = {}  # id(fn) -> (fn, its code, trampoline, key, (note, copy)); holds fn
_found: dict[frozenset, list] = {}  # files -> the functions of those modules and their classes
_module_runs: dict[str, int] = {}  # file -> how many times its module code ran (once: imported)
_rerun: set[str] = set()  # files whose module code ran more than once: copies of their functions exist
_audit_installed = False


def _audit(event: str, args) -> None:
    """Every `exec` of a code object: a module's code run again, or a watched file's code run in a block."""
    if event != "exec" or not args:
        return
    code = args[0]
    path = getattr(code, "co_filename", None)
    if not isinstance(path, str):
        return
    if code.co_name == "<module>":
        runs = _module_runs[path] = _module_runs.get(path, 0) + 1
        if runs > 1:
            _rerun.add(path)
        if runs > 1 or _watchers:
            _note(path, "<its module code, run again>", ran=True)
    elif _watchers:
        _note(path, code.co_name, ran=True)


def watch_module_runs() -> None:
    """Install the audit hook once per process (before any submission code runs, under the grader):
    the modules imported so far count as run once."""
    global _audit_installed
    if _audit_installed:
        return
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            _module_runs.setdefault(path, 1)
            _module_runs.setdefault(os.path.abspath(path), 1)
    sys.addaudithook(_audit)
    _audit_installed = True


def _trampoline(original: types.CodeType, key: str) -> types.CodeType:
    """The code of a function with `original`'s parameters (names, kinds, order: the function object
    keeps its defaults, which apply to them) and free variables (a function's new `__code__` must keep
    their number), which notes the call and passes every argument on to the original's copy. `key`
    names the (note, copy) pair in the function's globals, where its code looks names up. It carries
    the original's file, first line and names, so that introspection (inspect.signature, getsource:
    Triton's interpreter reads a kernel's source) sees the original."""
    code = original
    positional = code.co_varnames[:code.co_argcount]
    keyword = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    rest = code.co_argcount + code.co_kwonlyargcount
    star = code.co_varnames[rest] if code.co_flags & inspect.CO_VARARGS else None
    rest += bool(star)
    starstar = code.co_varnames[rest] if code.co_flags & inspect.CO_VARKEYWORDS else None
    params = list(positional[:code.co_posonlyargcount]) + (["/"] if code.co_posonlyargcount else [])
    params += list(positional[code.co_posonlyargcount:])
    params += [f"*{star}"] if star else (["*"] if keyword else [])
    params += list(keyword) + ([f"**{starstar}"] if starstar else [])
    passed = list(positional) + ([f"*{star}"] if star else []) + [f"{k}={k}" for k in keyword]
    passed += [f"**{starstar}"] if starstar else []
    # The free variables, referenced in dead code: free here too, never read (a cell may be empty).
    touch = "".join(f"            {v}\n" for v in code.co_freevars) or "            pass\n"
    source = (f"def _outer({', '.join(code.co_freevars)}):\n"
              f"    def _wire({', '.join(params)}):\n"
              f"        if False:\n{touch}"
              f"        {key}[0]()\n"
              f"        return {key}[1]({', '.join(passed)})\n"
              f"    return _wire\n")
    namespace: dict = {}
    exec(compile(source, TRAMPOLINE_FILE, "exec"), namespace)
    wire = next(c for c in namespace["_outer"].__code__.co_consts if isinstance(c, types.CodeType))
    assert wire.co_freevars == code.co_freevars and wire.co_argcount == code.co_argcount, (wire, code)
    return wire.replace(co_filename=code.co_filename, co_firstlineno=code.co_firstlineno, co_name=code.co_name,
                        co_qualname=code.co_qualname)


def _code_file(fn) -> str:
    """Where `fn`'s own code lives (its original's, while a wire stands in). Code objects carry the
    path they were compiled from, absolute for anything imported from a file, as `files` holds them."""
    return fn.__code__.co_filename  # a wire's trampoline carries its original's


def _functions_of(module, files: frozenset) -> list[types.FunctionType]:
    found = []

    def add(obj) -> None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for accessor in (obj.fget, obj.fset, obj.fdel):
                if accessor is not None:
                    add(accessor)
        elif isinstance(obj, types.FunctionType) and id(obj) not in _copies and _code_file(obj) in files:
            found.append(obj)

    def visit_class(cls, depth: int = 0) -> None:
        for value in list(vars(cls).values()):
            if isinstance(value, type) and value.__module__ == cls.__module__ and depth < 8:
                visit_class(value, depth + 1)
            else:
                add(value)

    for value in list(vars(module).values()):
        if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
            visit_class(value)
        else:
            add(value)
    return found


def _live_functions(files: frozenset, include_frozen: bool = False) -> list[types.FunctionType]:
    """Every live function whose code comes from `files` (`tripwires` keeps the answer per file set).
    `include_frozen`: also the objects `gc.freeze()` moved out of the collector's sight (the recording
    freezes everything older than the check call, a copy made by the student's earlier cells too)."""
    frozen = include_frozen and gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    try:
        return [o for o in gc.get_objects() if type(o) is types.FunctionType
                and id(o) not in _copies and _code_file(o) in files]
    finally:
        if frozen:
            gc.freeze()


def _note(path: str, name: str, ran: bool = False) -> None:
    """A call of `path`'s function `name` (`ran`: its code was run by `exec`, not called through a wire)."""
    for names, direct, hits in _watchers:
        if len(hits) >= MAX_HITS:
            continue
        if path in names:
            hits.append((names[path], name))
        elif path in direct and (ran or _called_by_the_student()):
            hits.append((direct[path], name))


def _called_by_the_student() -> bool:
    """Whether the wired function was called straight from the student's code: the frames are this
    function, `_note`, the wire's note, the wire itself, then its caller."""
    from .user_code import is_user_file

    try:
        caller = sys._getframe(4)
    except ValueError:
        return False
    return is_user_file(caller.f_code.co_filename)


def _prepare(fn: types.FunctionType) -> tuple:
    """(trampoline code, its globals key, (note, copy of the original)) for `fn`, built once per function:
    a block lays hundreds of wires (a check calls the student's function once per engine step)."""
    ready = _prepared.get(id(fn))
    if ready is None:
        original = fn.__code__
        copy = types.FunctionType(original, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__ = fn.__kwdefaults__
        _copies.add(id(copy))
        path, name = original.co_filename, original.co_name
        key = f"__ag_tripwire_{next(_serial)}"  # a name no module uses, there only while the wire is
        ready = _prepared[id(fn)] = (fn, original, _trampoline(original, key), key,
                                     (lambda: _note(path, name), copy))
    return ready


def _lay(fn: types.FunctionType) -> None:
    if id(fn) in _wired:
        fn_, code, key, users = _wired[id(fn)]
        _wired[id(fn)] = (fn_, code, key, users + 1)
        return
    _, original, trampoline, key, pair = _prepare(fn)
    fn.__globals__[key] = pair
    fn.__code__ = trampoline
    _wired[id(fn)] = (fn, original, key, 1)


def _lift(fn: types.FunctionType) -> None:
    fn_, code, key, users = _wired[id(fn)]
    if users > 1:
        _wired[id(fn)] = (fn_, code, key, users - 1)
        return
    del _wired[id(fn)]
    fn.__code__ = code
    fn.__globals__.pop(key, None)


@contextlib.contextmanager
def tripwires(modules, hits: list, direct_only=()):
    """Append (module name, function name) to `hits` (at most MAX_HITS) for every call, in the
    block, of a function whose code lives in one of `modules`: modules, file paths, or single
    functions (only that function is watched, not the rest of its module). `direct_only`: modules
    whose functions count only when the student's code calls them itself (the checks' own code,
    which the check's harness and the engine call on the student's behalf)."""
    names: dict[str, str] = {}  # file -> module name, as a hit names it
    direct = {os.path.abspath(m.__file__): m.__name__ for m in direct_only if getattr(m, "__file__", None)}
    loaded, single = [], []
    for mod in modules:
        if type(mod) is types.FunctionType:
            single.append(mod)
            continue
        path = getattr(mod, "__file__", None) or (mod if isinstance(mod, str) else None)
        if path:
            names[os.path.abspath(path)] = getattr(mod, "__name__", path)
            if isinstance(mod, types.ModuleType):
                loaded.append(mod)
    files = frozenset(names)
    if files not in _found:  # the modules' contents and the live closures: looked up once per file set
        functions, seen = [], set()
        for fn in itertools.chain(*(_functions_of(m, files) for m in loaded), _live_functions(files)):
            if id(fn) not in seen:
                seen.add(id(fn))
                functions.append(fn)
        _found[files] = functions
    functions = _found[files] + [fn for fn in single if _code_file(fn) not in files]
    if files & _rerun:  # copies of these modules' functions were made since: wire those too
        known = {id(fn) for fn in functions}
        functions += [fn for fn in _live_functions(files, include_frozen=True) if id(fn) not in known]
    for fn in single:
        names.setdefault(_code_file(fn), fn.__module__)
    # The checks' modules are reloaded before every graded cell: their functions are read afresh
    # (module contents only: no heap scan, which a block per engine step could not afford).
    direct_files = frozenset(direct)
    functions = functions + [fn for m in direct_only for fn in _functions_of(m, direct_files)]
    watcher = (names, direct, hits)
    laid = []
    watch_module_runs()
    try:
        for fn in functions:
            _lay(fn)
            laid.append(fn)
        _watchers.append(watcher)
        yield hits
    finally:
        for i in range(len(_watchers) - 1, -1, -1):
            if _watchers[i] is watcher:
                del _watchers[i]
        for fn in reversed(laid):
            _lift(fn)
