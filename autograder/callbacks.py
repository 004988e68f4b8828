"""What the student's code may do to the grader's objects: the rule a record's callbacks obey.

The student's code calls back into the grader's objects (an engine, a kv manager, a request's
output list); in replay the grader re-does each call on its real objects, with arguments read
from the record, which the student can write. So a callback is re-done only when it is a
question the engine's own pieces answer, never one that reaches outside the process's memory:

- **what may be called**: a function or method of course_lib's engine packages
  (`ENGINE_PACKAGES`: kv, scheduler, engine, runner, model, attention, sim, ...) or of the checks'
  own harness (`autograder.checks`: the `make_engine` / `submit` a check hands over) whose code
  does no I/O (`io_reason`: it names no builtin such as `open`, `exec` or `__import__`, no module
  that does I/O nor anything defined in one (`IO_MODULES`: os, pathlib, subprocess, ..., and
  course_lib's own serving and saving modules), no method named like a save or a load
  (`IO_METHODS`), and neither do the functions of its own module and the methods of its own class
  it names, read the same way); a course_lib model called like a function (its `forward`, read
  the same way); a method of a builtin container (`list.append`, `dict.get`, `deque.popleft`).
  Nothing else: no class, no builtin function, no method of a library's object (`Path.write_text`,
  `ndarray.tofile`, `Tensor.__reduce__`), no course_lib method that saves or loads
  (`ModelConfig.save`, `CharTokenizer.save`: they name `pathlib.Path`);
- **what may come back as a handle** (the result of any callback, and anything it holds): values
  that cross as data, builtin containers and their views and iterators, course_lib objects (not
  classes), torch modules (a model's layers), the callables above, the student's own objects.
  Anything else (a module, a class, a path, a file, a frame, a library's bound method) is refused,
  so the record can never name it in a later event;
- **what else may run**: an operation on a course_lib object runs its special method or property
  (`__getitem__`, `len`, a property's getter), read the same way; no special attribute is ever
  read or set (`__class__`, `__dict__`, `__globals__`: the road to `os.system`).

The same rule holds when the record is written (in the sandbox, the student's code gets the
refusal as an AttributeError or TypeError with this module's reason, and the recorder never
writes the refused event) and when it is replayed (a record holding such an event was forged: "the
record of your code does not answer what the check asks"). The rule reads code, it runs nothing;
the replay's process can write no file anyway (autograder.replay_process). Which callbacks honest
records make was measured on every exercise's reference, controls and mutants on every graded
seed (docs/grading.md, "How the verdict is decided"): all of them are allowed.
"""
from __future__ import annotations

import builtins
import collections
import dis
import functools
import inspect
import os
import sys
import types

import numpy as np
import torch

# Packages whose code the student's side may run on the grader's objects.
ENGINE_PACKAGES = ("course_lib.engine", "course_lib.request_output", "course_lib.engine_config",
                   "course_lib.runner", "course_lib.runner_batch", "course_lib.sampler", "course_lib.clock",
                   "course_lib.static_batching", "course_lib.kv",
                   "course_lib.scheduler", "course_lib.model", "course_lib.attention", "course_lib.sim",
                   "course_lib.spec",  # the drafters and the acceptance rule the step calls (speculative decoding)
                   "autograder.checks")

# Modules (and packages) whose functions reach outside the process's memory: files, processes,
# sockets, imports, foreign code. A function that names one of them, or anything defined in one,
# is I/O. (course_lib's own modules that exist to save, load or serve are listed too.)
IO_MODULES = frozenset({
    "os", "posix", "nt", "io", "_io", "pathlib", "shutil", "subprocess", "socket", "pickle", "marshal", "shelve",
    "dbm", "sqlite3", "tempfile", "importlib", "pkgutil", "runpy", "zipimport", "urllib", "http", "ftplib",
    "smtplib", "zipfile", "tarfile", "gzip", "bz2", "lzma", "multiprocessing", "ctypes", "webbrowser", "mmap",
    "fcntl", "ssl", "select", "selectors", "signal", "resource", "safetensors", "huggingface_hub", "requests",
    "urllib3", "matplotlib", "IPython", "course_lib.serve", "course_lib.cli", "course_lib.loadgen",
    "course_lib.bench", "course_lib.viz", "course_lib.model.hf", "course_lib.model.to_hf",
    "course_lib.model.weights", "autograder.record", "autograder.grade", "autograder.sandbox", "autograder.batch",
    "autograder.replay", "autograder.replay_process",
})
# Builtins that reach outside memory or turn data into code.
IO_BUILTINS = frozenset({"open", "exec", "eval", "compile", "__import__", "input", "breakpoint"})
# Methods that save, load or touch the file system on whatever object has them (a path, an
# array, a tensor, a config): a function calling a method of that name is I/O.
IO_METHODS = frozenset({
    "save", "load", "dump", "write", "write_text", "write_bytes", "writelines", "read_text", "read_bytes",
    "tofile", "fromfile", "to_file", "from_file", "savez", "savez_compressed", "savetxt", "loadtxt", "mkdir",
    "makedirs", "unlink", "rmdir", "rmtree", "touch", "symlink_to", "hardlink_to", "chmod", "chown", "rename",
    "truncate", "exec_module", "import_module", "save_pretrained", "from_pretrained", "to_csv", "to_json",
    "savefig", "save_trace", "load_trace",
})

# Values a callback may hand back as a handle without a further look (exact types: a subclass
# may bring methods of its own): builtin containers and values, their views and iterators.
_CONTAINERS = frozenset({list, dict, set, frozenset, tuple, str, bytes, bytearray, int, float, complex, bool,
                         range, slice, type(None), collections.deque, collections.OrderedDict,
                         collections.defaultdict, collections.Counter, types.SimpleNamespace})
_VIEWS_AND_ITERATORS = frozenset(type(x) for x in (
    {}.keys(), {}.values(), {}.items(), iter({}), iter({}.values()), iter({}.items()), iter([]), iter(()),
    iter(set()), iter(range(0)), iter(""), reversed([]), iter(collections.deque()), enumerate([]), zip(),
    reversed(collections.OrderedDict()), iter(bytearray()), reversed(range(0))))
_DATA = frozenset({torch.Tensor, torch.nn.Parameter, np.ndarray, torch.dtype, torch.device})

# The special method each operation runs on its target (getattr, setattr: a property's accessors).
_SPECIAL = {"len": ("__len__",), "iter": ("__iter__",), "next": ("__next__",), "bool": ("__bool__", "__len__"),
            "repr": ("__repr__",), "str": ("__str__", "__repr__"), "int": ("__int__",), "float": ("__float__",),
            "index": ("__index__",), "neg": ("__neg__",), "abs": ("__abs__",), "hash": ("__hash__",),
            "enter": ("__enter__",), "exit": ("__exit__",), "getitem": ("__getitem__",),
            "setitem": ("__setitem__",), "delitem": ("__delitem__",), "contains": ("__contains__", "__iter__"),
            "getattr": ("__getattr__", "__getattribute__"), "setattr": ("__setattr__",),
            "delattr": ("__delattr__",)}


def _under(module: str | None, packages) -> bool:
    return bool(module) and any(module == p or module.startswith(p + ".") for p in packages)


def _defining_module(obj) -> str:
    name = getattr(obj, "__module__", None)
    return name if isinstance(name, str) else ""


@functools.lru_cache(maxsize=None)
def _source_roots() -> tuple[str, ...]:
    """Folders whose files hold the code the rule trusts (course_lib's and the checks')."""
    import course_lib
    from . import checks

    return (os.path.dirname(os.path.abspath(course_lib.__file__)) + os.sep,
            os.path.dirname(os.path.abspath(checks.__file__)) + os.sep)


def _unwrap(fn):
    """The function behind torch's `@no_grad()` / `@inference_mode()` decorators (their wrapper's
    code is torch's; what runs is the wrapped course_lib function)."""
    for _ in range(4):
        code = getattr(fn, "__code__", None)
        if code is None or not code.co_filename.replace(os.sep, "/").endswith("torch/utils/_contextlib.py"):
            return fn
        inner = inspect.getattr_static(fn, "__wrapped__", None)
        if not isinstance(inner, types.FunctionType):
            return fn
        fn = inner
    return fn


def _trusted_function(fn) -> bool:
    """A plain Python function of the engine packages, with its code in course_lib's or the checks' folder."""
    return (isinstance(fn, types.FunctionType) and _under(_defining_module(fn), ENGINE_PACKAGES)
            and os.path.abspath(fn.__code__.co_filename).startswith(_source_roots()))


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _absolute(name: str, level: int, module: str) -> str:
    if not level:
        return name
    base = module.rsplit(".", level)[0] if module.count(".") >= level else ""
    return f"{base}.{name}" if name else base


def _uses(fn) -> list[tuple[str, object]]:
    """(name, what it stands for) for every global, builtin, attribute and import the function's
    code (and the functions nested in it) uses: resolved where Python would resolve it, without
    running or importing anything (a module not imported yet stands for nothing)."""
    scope, out = fn.__globals__, []
    for co in _code_objects(fn.__code__):
        instructions = list(dis.get_instructions(co))
        for i, ins in enumerate(instructions):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                name = ins.argval
                out.append((name, scope[name] if name in scope else getattr(builtins, name, None)))
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"):
                out.append(("." + ins.argval, None))
            elif ins.opname == "IMPORT_NAME":
                level = instructions[i - 2].argval if i >= 2 and instructions[i - 2].opname == "LOAD_CONST" else 0
                module = _absolute(ins.argval, level or 0, fn.__module__ if level else "")
                out.append(("import " + module, sys.modules.get(module)))
                for nxt in instructions[i + 1:]:
                    if nxt.opname != "IMPORT_FROM":
                        if nxt.opname.startswith("STORE"):
                            continue
                        break
                    value = getattr(sys.modules.get(module), nxt.argval, None)
                    if value is None:
                        value = sys.modules.get(f"{module}.{nxt.argval}")
                    out.append((f"{module}.{nxt.argval}", value))
    return out


def _functions_of(value):
    """The Python functions a name may stand for: a function, a method, a property's accessors,
    a class's constructor (its __init__ / __new__ / __post_init__)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    if isinstance(value, functools.partial):
        return _functions_of(value.func)
    if isinstance(value, types.MethodType):
        return [value.__func__]
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        return [f for name in ("__init__", "__new__", "__post_init__", "__call__")
                for f in _functions_of(inspect.getattr_static(value, name, None))]
    return []


def io_reason(fn, cls=None) -> str | None:
    """Why running `fn` (a method of `cls`, if given) may reach outside memory (None: it may not).

    The code is read, not run: every name it uses, resolved where Python would resolve it (the
    function's module, the builtins, the class of `self`, the modules it imports), and the
    functions of its own module and methods of its own class those names stand for, read the same
    way (other course_lib code is judged where a callback calls it)."""
    fn = _unwrap(fn)
    if not _trusted_function(fn):
        return f"{_describe(fn)} is not course_lib's engine code"
    return _io_reason_cached(fn, cls)


@functools.lru_cache(maxsize=4096)
def _io_reason_cached(fn, cls):
    todo, seen = [(fn, cls)], set()
    while todo:
        fn, cls = todo.pop()
        if (fn.__code__, cls) in seen:
            continue
        seen.add((fn.__code__, cls))
        where = f"{fn.__module__}.{fn.__qualname__}"
        for name, value in _uses(fn):
            bare = name.lstrip(".")
            if name.startswith(".") and bare in IO_METHODS:
                return f"{where} calls .{bare}(), which saves, loads or touches files"
            if not name.startswith(".") and name in IO_BUILTINS and value is getattr(builtins, name, None):
                return f"{where} uses {name}()"
            found = [value] if value is not None else []
            if name.startswith(".") and cls is not None:
                try:
                    found.append(inspect.getattr_static(cls, bare))
                except AttributeError:
                    pass
            if name.startswith("import "):
                module = name.removeprefix("import ")
                if _under(module, IO_MODULES):
                    return f"{where} imports {module}"
                continue
            for v in found:
                if isinstance(v, types.ModuleType):
                    if _under(v.__name__, IO_MODULES):
                        return f"{where} uses the module {v.__name__}"
                    continue
                module = _defining_module(v) if callable(v) else ""
                if _under(module, IO_MODULES):
                    return f"{where} uses {bare} from {module}"
                for inner in _functions_of(v):
                    inner = _unwrap(inner)
                    # followed: methods of its own class, functions of its own module (a helper
                    # that does the writing); other course_lib code is judged where it is called
                    if _trusted_function(inner) and (name.startswith(".") or inner.__module__ == fn.__module__):
                        todo.append((inner, cls if name.startswith(".") else _owner(v)))
    return None


def _owner(value):
    return value if isinstance(value, type) else None


def _describe(obj) -> str:
    if isinstance(obj, types.FunctionType):
        return f"{_defining_module(obj)}.{obj.__qualname__}"
    return f"a {type(obj).__name__}"


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------


def _engine_class(cls) -> bool:
    return _under(getattr(cls, "__module__", None), ENGINE_PACKAGES)


def _is_container_method(target) -> bool:
    """`list.append`, `dict.get`, `deque.popleft`: a builtin method of a builtin container or value."""
    return isinstance(target, types.BuiltinMethodType) and type(getattr(target, "__self__", None)) in (
        _CONTAINERS | _VIEWS_AND_ITERATORS)


def call_refusal(target) -> str | None:
    """Why the grader does not call `target` for the student's code (None: it does)."""
    if _is_container_method(target):
        return None
    cls = type(target)
    if isinstance(target, types.MethodType):
        fn, cls = target.__func__, type(target.__self__)
    elif isinstance(target, types.FunctionType):
        fn, cls = target, None
    elif isinstance(target, torch.nn.Module) and _engine_class(cls):
        if inspect.getattr_static(cls, "__call__", None) is not inspect.getattr_static(torch.nn.Module, "__call__"):
            return f"the grader does not call a {cls.__qualname__} that changes how a model is called"
        fn = inspect.getattr_static(cls, "forward", None)
    elif not isinstance(target, type) and _engine_class(cls):
        fn = inspect.getattr_static(cls, "__call__", None)
    else:
        return _not_engine(target)
    fn = _unwrap(fn)
    if not _trusted_function(fn):
        return _not_engine(target)
    why = _io_reason_cached(fn, cls)
    if why:
        return f"the grader does not call {fn.__qualname__} for your code: it may reach files or the system ({why})"
    return None


def _not_engine(target) -> str:
    return f"the grader's {_kind(target)} is not one of the engine's own functions: it does not call it for your code"


# A decision depends on the operation, the attribute's name and the target's class (for a call: the
# function and its owner's class), never on the instance, and the classes it reads are the grader's
# own, which nothing from a record can change (no class crosses as a handle). A scheduler's check asks
# the same few thousand questions again and again (a third of the recording's time before the cache):
# each is decided once per process.
_DECISIONS: dict = {}
MAX_DECISIONS = 1 << 16


def _decision_key(op: str, name, target):
    """What the decision on (op, name, target) depends on, or None when it is not worth a key."""
    if op != "call":
        return (op, name, type(target)) if name is None or type(name) is str else None
    if isinstance(target, types.MethodType):
        return ("method", target.__func__, type(target.__self__))
    if isinstance(target, types.FunctionType):
        return ("function", target)
    if isinstance(target, types.BuiltinMethodType):
        return ("builtin", type(getattr(target, "__self__", None)), target.__name__)
    if isinstance(target, type):
        return None
    return ("instance", type(target))


def op_refusal(op: str, name, target) -> str | None:
    """Why the grader does not do the student's `op` (with `name`) on its object `target` (None: it does)."""
    key = _decision_key(op, name, target)
    if key is None:
        return _op_refusal(op, name, target)
    try:
        return _DECISIONS[key]
    except KeyError:
        pass
    except TypeError:  # (an unhashable function owner: decided each time)
        return _op_refusal(op, name, target)
    why = _DECISIONS[key] = _op_refusal(op, name, target)
    if len(_DECISIONS) > MAX_DECISIONS:
        _DECISIONS.clear()
    return why


def _op_refusal(op: str, name, target) -> str | None:
    if op in ("getattr", "setattr", "delattr") and (not isinstance(name, str) or name.startswith("__")):
        return f"the grader's objects do not share their special attributes ({name!r})"
    if op == "call":
        return call_refusal(target)
    cls = type(target)
    if not _engine_class(cls):
        return None  # a builtin container's, a torch module's own methods
    code = list(_SPECIAL.get(op, ()))
    if op in ("getattr", "setattr", "delattr"):
        code.append(name)
    for attr in code:
        try:
            value = inspect.getattr_static(cls, attr)
        except AttributeError:
            continue
        kinds = (property, types.FunctionType, classmethod, staticmethod)
        for fn in _functions_of(value) if isinstance(value, kinds) else ():
            fn = _unwrap(fn)
            why = _io_reason_cached(fn, cls) if _trusted_function(fn) else None
            if why:
                return (f"the grader does not run {fn.__qualname__} for your code: it may reach files or the "
                        f"system ({why})")
    return None


def hold_refusal(value) -> str | None:
    """Why a value of the grader's may not cross to the student's code as a handle (None: it may)."""
    cls = type(value)
    if cls in _CONTAINERS or cls in _VIEWS_AND_ITERATORS or cls in _DATA or isinstance(value, np.generic):
        return None
    if isinstance(value, (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType, type)):
        return f"the grader does not hand over a {cls.__name__} object"
    if isinstance(value, (types.MethodType, types.FunctionType, types.BuiltinMethodType, types.BuiltinFunctionType)):
        why = call_refusal(value)
        return None if why is None else f"the grader does not hand over its {_kind(value)} ({why})"
    if _engine_class(cls) or isinstance(value, torch.nn.Module):
        return None  # course_lib's objects (each use of them obeys the rule), a model's layers
    return f"the grader does not hand over a {cls.__qualname__} object ({cls.__module__}) to your code"


def _kind(obj) -> str:
    if isinstance(obj, types.MethodType):
        return f"method {type(obj.__self__).__qualname__}.{getattr(obj.__func__, '__name__', '?')}"
    if isinstance(obj, types.BuiltinMethodType):
        owner = getattr(obj, "__self__", None)
        return f"builtin {type(owner).__qualname__}.{obj.__name__}" if owner is not None else f"builtin {obj.__name__}"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__qualname__}"
    return f"{type(obj).__qualname__} object"
