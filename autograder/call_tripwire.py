"""Notice calls into given modules' code without a profiler: trip wires in their functions.

`forbid_calls` must learn whether a student's function ran the exercise's reference (course_lib's
counterpart), however the student reached it. A profile hook (`sys.setprofile`) sees every call,
but it runs a Python callback on each call and return of *all* code in the block: it doubled the
recorded checks (check_StudentBlockPool over its three seeds: 1.0 s with the hook, 0.5 s without).

A trip wire costs nothing until it fires: for the block, every function whose code lives in one of
the modules' files gets a new `__code__`, a trampoline that calls its stand-in, which notes (module,
function name) and calls a copy of the original (out of reach in the stand-in's closure). The
function *object* is changed, so every reference to it trips the wire:
a name imported before (`from course_lib.kv.slots import slot_mapping as sm`), a bound method of an
instance made earlier, a functools.partial. The wires are laid on

- the modules' functions, and the functions, static and class methods and property accessors of
  the classes defined in them (nested classes too);
- every other live function object whose code comes from those files (closures a reference factory
  returned, the function inside a decorator), found once per set of files by a scan of the garbage
  collector's objects (about 50 ms with torch loaded).

A function made from those files *during* the block is made by code that already tripped a wire.
A module's code run a second time (`runpy.run_path` of its file, `importlib.reload`, `exec` of its
code), or a function made by hand from a function's code (`types.FunctionType`, `marshal`, a code
`.replace()`d or assigned to another function) is a new function object no wire was laid on: an
audit hook (`sys.addaudithook`, which no code can remove) sees each, notes a watched file's code run
or copied inside a block as a call, and remembers the files and bytecode copied, whose live
functions a later block looks up again (the scan then includes the objects `gc.freeze()` hid). A
one-line copy found by bytecode must also use the same names (`return len(self.queue)` in the standard
library shares its bytecode with course_lib's `return len(self._free)`); a longer one is a copy by its
bytecode alone, whatever names it was given. A function may also hold a watched
file's code among its constants (put there by `code.replace(co_consts=...)`): each time it runs, Python
makes a function of that code with no audit event; once code was made by hand, the scan looks inside
each function's code too and wires the function that holds the copy.
A block may spare some of the modules' functions (`allowed`: helpers the notebook hands the student,
which compute no part of the answer): no wire is laid on them, and a wire another block laid on one
notes nothing for this block. A helper is spared by its code (its file, qualified name, bytecode,
names, constants and nested code, against its file compiled afresh), so a copy of it is spared too,
and nothing else is, whatever name it is reached by.
Blocks nest (each notes what runs inside it). Like the profile hook it replaces, it notes calls in
every thread, and is a review aid a determined student can undo (restoring `__code__`), not a
security boundary.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import gc
import inspect
import itertools
import os
import sys
import types

MAX_HITS = 1000
TRAMPOLINE_FILE = "<call_tripwire>"
_serial = itertools.count()
# open blocks: ({file: module}, {file: module, direct calls}, hits, the ids of the spared functions)
_watchers: list[tuple[dict, dict, list, set]] = []
_wired: dict[int, tuple[types.FunctionType, types.CodeType, str, int]] = {}  # id -> (fn, code, key, users)
_copies: set[int] = set()  # the originals' copies the stand-ins call: never wired themselves
_prepared: dict[int, tuple] = {}  # id(fn) -> (fn, its code, trampoline, key, stand-in); holds fn
_found: dict[frozenset, list] = {}  # files -> the functions of those modules and their classes
_found_bytecode: dict[frozenset, dict] = {}  # files -> {their functions' bytecode: {names it uses: file}}
_module_runs: dict[str, int] = {}  # file -> how many times its module code ran (once: imported)
# Copies of functions exist (a module's code run again, a function made by hand or given another's code):
# the files their code names, and their bytecode (a copy may carry another file name). Bounded: a flood
# of copies only makes later blocks search the heap.
_copied_files: set[str] = set()
_copied_bytecode: set[bytes] = set()
# Code was made by hand (`code.replace`, `types.CodeType`) or nested in another file's code: a function may
# hold a watched file's code among its constants, which Python turns into a function, with no audit event
# and no wire, each time it runs (a nested `def`). Later searches of the heap then look inside each code.
_hosts_possible = False
_watched_bytecode: set[bytes] = set()  # the watched functions' bytecode met so far (`tripwires`)
MAX_COPIED = 10_000
_own_work = False  # set while this module makes its own copies and sets its wires (not a student's)
_trampoline_codes: set = set()  # the wires' code (a frame running one is the wire, not its caller)
_audit_installed = False


def _audit(event: str, args) -> None:
    """Every `exec` of a code object (a module's code run again, or a watched file's code run in a block),
    and every function or code object made by hand, or code given to a function (a copy of another)."""
    if _own_work or not args:
        return
    global _hosts_possible
    if event == "function.__new__":
        code = args[0]
        _copied(code.co_filename, code.co_code)
        _nested_copies(code)
        if _watchers:
            _note(code.co_filename, f"<a copy of {code.co_name}, made>", ran=True)
    elif (event == "object.__setattr__" and len(args) == 3 and args[1] == "__code__"
          and isinstance(args[2], types.CodeType)):
        _copied(args[2].co_filename, args[2].co_code)
        _nested_copies(args[2])
    elif event == "code.__new__" and isinstance(args[0], bytes):
        _copied(None, args[0])  # (its file name may be another's: the bytecode is what a copy shares)
        _hosts_possible = True
    elif event == "exec" and isinstance(args[0], types.CodeType):
        _nested_copies(args[0], by_bytecode=False)
    if event == "exec" and isinstance(args[0], types.CodeType) and not args[0].co_filename.startswith("<"):
        code, path = args[0], args[0].co_filename
        if code.co_name == "<module>":
            runs = _module_runs[path] = _module_runs.get(path, 0) + 1
            if runs > 1:
                _copied(path, None)
            if runs > 1 or _watchers:
                _note(path, "<its module code, run again>", ran=True)
        elif _watchers:
            _note(path, code.co_name, ran=True)


def _nested_codes(code: types.CodeType):
    """The code objects `code` nests (its functions, lambdas, comprehensions, theirs), at most 10,000."""
    todo = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for _ in range(10_000):
        if not todo:
            return
        nested = todo.pop()
        yield nested
        todo += [c for c in nested.co_consts if isinstance(c, types.CodeType)]


def _nested_copies(code: types.CodeType, by_bytecode: bool = True) -> None:
    """Remember the copies `code` nests: code of another file (compile gives all the code one source nests
    that source's file, so another file's was put there by hand, `code.replace(co_consts=...)`) or, with
    `by_bytecode` (code made by hand), a course_lib function's bytecode (of a function longer than a
    line: `_substantial`). Not for code compiled from source (`exec`, an import): an honest answer can
    compile to course_lib's bytecode, and so does the answer key."""
    global _hosts_possible
    for nested in _nested_codes(code):
        if nested.co_filename != code.co_filename or (
                by_bytecode and (nested.co_code in _watched_bytecode or nested.co_code in _course_lib_bytecode())
                and _substantial(nested)):
            _copied(nested.co_filename, nested.co_code)
            _hosts_possible = True


@functools.cache
def _course_lib_bytecode() -> frozenset[bytes]:
    """The bytecode of every course_lib function, compiled from its files (imported or not yet, ~0.2 s):
    what code made by hand is compared with (`_nested_copies`), also before any block ran. Worked out the
    first time code is made by hand, which an honest notebook never does, not when the hook is installed."""
    if "course_lib" not in sys.modules:
        return frozenset()
    package = os.path.dirname(os.path.abspath(sys.modules["course_lib"].__file__))
    return frozenset(p[0] for folder, _, files in os.walk(package) for name in files if name.endswith(".py")
                     for prints in _compiled_code(os.path.join(folder, name)).values() for p in prints)


def _copied(path: str | None, bytecode: bytes | None) -> None:
    """Remember that copies of `path`'s functions, or of functions with this `bytecode`, may exist."""
    if len(_copied_files) + len(_copied_bytecode) >= MAX_COPIED:
        return
    if path is not None:
        _copied_files.add(path)
    if bytecode is not None:
        _copied_bytecode.add(bytecode)


@contextlib.contextmanager
def _ours():
    """Around this module's own copies and wires: the audit events they raise are not a student's."""
    global _own_work
    _own_work = True
    try:
        yield
    finally:
        _own_work = False


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
    their number), which passes every argument on to its stand-in (`_stand_in`: it notes the call and runs
    the original's copy). `key` names the stand-in in the function's globals, where its code looks names
    up. It carries
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
              f"        return {key}({', '.join(passed)})\n"
              f"    return _wire\n")
    namespace: dict = {}
    exec(compile(source, TRAMPOLINE_FILE, "exec"), namespace)
    wire = next(c for c in namespace["_outer"].__code__.co_consts if isinstance(c, types.CodeType))
    assert wire.co_freevars == code.co_freevars and wire.co_argcount == code.co_argcount, (wire, code)
    wire = wire.replace(co_filename=code.co_filename, co_firstlineno=code.co_firstlineno, co_name=code.co_name,
                        co_qualname=code.co_qualname)
    _trampoline_codes.add(wire)
    return wire


def _original_code(fn) -> types.CodeType:
    """`fn`'s own code, also while a wire stands in for it."""
    return _wired[id(fn)][1] if id(fn) in _wired else fn.__code__


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


def _live_functions(files: frozenset) -> list[types.FunctionType]:
    """Every live function (the collector sees) whose code comes from `files`: closures made inside the
    modules' functions (`tripwires` keeps the answer per file set)."""
    return [o for o in gc.get_objects() if type(o) is types.FunctionType and id(o) not in _copies
            and _code_file(o) in files]


@functools.lru_cache(maxsize=4096)
def _names_used(code: types.CodeType) -> tuple:
    """The global and attribute names `code`'s instructions use, in order: with the bytecode, what tells
    a copy from a function of the same shape (`return len(self.queue)` and `return len(self._free)` share
    their bytecode). Names listed but never used do not count: a copy padded with some is still a copy."""
    return tuple(i.argval for i in dis.get_instructions(code) if i.opcode in dis.hasname)


def _copy_of(code: types.CodeType, files: frozenset, bytecode: dict) -> str | None:
    """The watched file `code` is a copy of (its own file, or a watched function's bytecode and names),
    else None."""
    if code.co_filename in files:
        return code.co_filename
    shapes = bytecode.get(code.co_code)
    if not shapes:
        return None
    # A one-liner's bytecode is shared with others (the standard library's `return len(self.queue)`): its
    # names must match too. A longer function's bytecode is a copy's, whatever names it was given.
    return shapes.get(_names_used(code)) or (next(iter(shapes.values())) if _substantial(code) else None)


def _substantial(code: types.CodeType) -> bool:
    """Longer than a line: at least 12 instructions (course_lib's one-line methods have 5 or 6)."""
    return sum(1 for i in dis.get_instructions(code) if i.opname not in ("CACHE", "RESUME", "NOP")) >= 12


def _live_copies(files: frozenset, bytecode: dict) -> list[tuple[types.FunctionType, str | None]]:
    """(function, the watched file it copies; None: its own file) for every live function, frozen ones
    too, whose code is a copy of the watched files' (`_copy_of`) or, once code was made by hand, nests one
    (the function then makes the copy each time it runs)."""
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    try:
        found = []
        for o in gc.get_objects():
            if type(o) is not types.FunctionType or id(o) in _copies:
                continue
            code = o.__code__
            if code.co_filename in files:
                found.append((o, None))
                continue
            path = _copy_of(code, files, bytecode)
            if path is None and _hosts_possible:
                path = next(filter(None, (_copy_of(c, files, bytecode) for c in _nested_codes(code))), None)
            if path is not None:
                found.append((o, path))
        return found
    finally:
        if frozen:
            gc.freeze()


def _note(path: str, name: str, ran: bool = False, fn_id: int | None = None) -> None:
    """A call of `path`'s function `name` (`ran`: its code was run by `exec`, not called through a wire;
    `fn_id`: the id of the wired function, which a block may spare)."""
    for names, direct, hits, spared in _watchers:
        if len(hits) >= MAX_HITS or fn_id in spared:
            continue
        if path in names:
            hits.append((names[path], name))
        elif path in direct and (ran or _called_by_the_student()):
            hits.append((direct[path], name))


def _called_by_the_student() -> bool:
    """Whether the wired function was called by the student's code: the frames are this function, `_note`,
    the stand-in, the wire (unless code called the stand-in itself), then its callers. Frames of code that
    only passes a call on (the standard library's `functools`, `unittest.mock`; any file outside course_lib
    and the autograder) are looked through; the first frame of course_lib's (the engine calling its hooks) or of
    the autograder's (the membrane's proxies, through which the check's callbacks reach the student) says
    it was not the student's own call."""
    from .user_code import is_user_file

    try:
        frame = sys._getframe(3)
    except ValueError:
        return False
    if frame.f_code in _trampoline_codes:
        frame = frame.f_back
    for _ in range(64):
        if frame is None:
            return False
        path = frame.f_code.co_filename
        if is_user_file(path):
            return True
        if path.startswith(_OWN_ROOTS):
            return False
        frame = frame.f_back
    return False


_OWN_ROOTS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                   for d in ("course_lib", "autograder"))


def _prepare(fn: types.FunctionType, path: str | None = None) -> tuple:
    """(fn, its code, trampoline, its globals key, stand-in) for `fn`, built once per function: a block
    lays hundreds of wires (a check calls the student's function once per engine step). `path`: the
    watched file a hit names (a copy found by its bytecode may name another)."""
    ready = _prepared.get(id(fn))
    if ready is None:
        original = fn.__code__
        with _ours():
            copy = types.FunctionType(original, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__ = fn.__kwdefaults__
        _copies.add(id(copy))
        path, name = path or original.co_filename, original.co_name
        key = f"__ag_tripwire_{next(_serial)}"  # a name no module uses, there only while the wire is
        ready = _prepared[id(fn)] = (fn, original, _trampoline(original, key), key,
                                     _stand_in(path, name, copy, id(fn)))
    return ready


def _stand_in(path: str, name: str, copy: types.FunctionType, fn_id: int):
    """What the wire calls: notes the call, then runs the original's copy. It sits in the watched module's
    globals while the wire is laid, so code can take it from there; calling it notes all the same (the
    copy is out of reach, in its closure). `fn_id`: the wired function's id (a block may spare it)."""
    def stand_in(*args, **kwargs):
        _note(path, name, fn_id=fn_id)
        return copy(*args, **kwargs)

    return stand_in


def _lay(fn: types.FunctionType, path: str | None = None) -> None:
    if id(fn) in _wired:
        fn_, code, key, users = _wired[id(fn)]
        _wired[id(fn)] = (fn_, code, key, users + 1)
        return
    ready = _prepare(fn, path)
    fn.__globals__[ready[3]] = ready[4]
    with _ours():
        fn.__code__ = ready[2]
    _wired[id(fn)] = (fn, ready[1], ready[3], 1)


def _lift(fn: types.FunctionType) -> None:
    fn_, code, key, users = _wired[id(fn)]
    if users > 1:
        _wired[id(fn)] = (fn_, code, key, users - 1)
        return
    del _wired[id(fn)]
    with _ours():
        fn.__code__ = code
    fn.__globals__.pop(key, None)


def _code_print(code: types.CodeType) -> tuple:
    """What a code object does: its bytecode, the names and constants it uses, and the same of the code it
    nests (a comprehension, a lambda). Equal bytecode alone is not enough: `code.replace(co_names=...)`
    keeps the bytecode and makes it load other globals, `co_consts=` other nested code."""
    consts = tuple(_code_print(c) if isinstance(c, types.CodeType)
                   else ("frozenset", tuple(sorted(map(repr, c)))) if isinstance(c, frozenset)  # (any order)
                   else (type(c).__name__, repr(c)) for c in code.co_consts)
    return code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, consts


@functools.cache
def _compiled_code(path: str) -> dict[str, set[tuple]]:
    """{qualified name: `_code_print`s} of every function `path`'s source compiles to, compiled here from the
    file: what a spared helper's code must be (`_spared`)."""
    try:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, set[tuple]] = {}
    todo = [code]
    while todo:
        code = todo.pop()
        found.setdefault(code.co_qualname, set()).add(_code_print(code))
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def _spared(allowed, functions, names: dict) -> set[int]:
    """The ids of the `functions` that `allowed` spares. `allowed`: "module:qualified name" strings (a
    class's name spares every function defined in its body). A function is judged by its own code, never
    by where it was found: its file is the watched module's (`names`: file -> module name), its qualified
    name is allowed, and its code (bytecode, names, constants, nested code) is what that file compiles to
    under that name. So a module attribute or a class member swapped for the reference is not spared,
    nor a copy of the reference relabelled with a helper's name (a code object cannot change;
    `code.replace` makes a new one)."""
    wanted = set(allowed)
    spared = set()
    for fn, _ in functions:
        code = _original_code(fn)
        module = names.get(code.co_filename)
        if module is None:
            continue
        qualname = code.co_qualname
        # The name and every enclosing name (a method's class): "FlatBatch.num_tokens" -> "FlatBatch".
        scopes = [qualname] + [qualname.rsplit(".", k)[0] for k in range(1, qualname.count(".") + 1)]
        if any(f"{module}:{scope}" in wanted for scope in scopes) \
                and _code_print(code) in _compiled_code(code.co_filename).get(qualname, ()):
            spared.add(id(fn))
    return spared


@contextlib.contextmanager
def tripwires(modules, hits: list, direct_only=(), allowed=()):
    """Append (module name, function name) to `hits` (at most MAX_HITS) for every call, in the
    block, of a function whose code lives in one of `modules`: modules, file paths, or single
    functions (only that function is watched, not the rest of its module). `direct_only`: modules
    whose functions count only when the student's code calls them itself (the checks' own code,
    which the check's harness and the engine call on the student's behalf). `allowed`: the functions
    (or classes) of those modules that the block spares, helpers a student may call, by name:
    "module:qualified name" (`_spared`)."""
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
        shapes: dict = {}
        for fn in functions:
            code = _original_code(fn)
            shapes.setdefault(code.co_code, {})[_names_used(code)] = _code_file(fn)
        _found_bytecode[files] = shapes
        _watched_bytecode.update(shapes)
    functions = [(fn, None) for fn in _found[files]] + [(fn, None) for fn in single if _code_file(fn) not in files]
    bytecode = _found_bytecode[files]
    if files & _copied_files or not _copied_bytecode.isdisjoint(bytecode):
        # Copies of these modules' functions were made since (a module run again, a function made by hand
        # from their code, or holding their code): find them, frozen ones too, and wire them as well.
        known = {id(fn) for fn, _ in functions}
        functions += [(fn, path) for fn, path in _live_copies(files, bytecode) if id(fn) not in known]
    for fn in single:
        names.setdefault(_code_file(fn), fn.__module__)
    # The checks' modules are reloaded before every graded cell: their functions are read afresh
    # (module contents only: no heap scan, which a block per engine step could not afford).
    direct_files = frozenset(direct)
    functions += [(fn, None) for m in direct_only for fn in _functions_of(m, direct_files)]
    spared = _spared(allowed, functions, names) if allowed else set()
    functions = [(fn, path) for fn, path in functions if id(fn) not in spared]
    watcher = (names, direct, hits, spared)
    laid = []
    watch_module_runs()
    try:
        for fn, path in functions:
            _lay(fn, path)
            laid.append(fn)
        _watchers.append(watcher)
        yield hits
    finally:
        for i in range(len(_watchers) - 1, -1, -1):
            if _watchers[i] is watcher:
                del _watchers[i]
        for fn in reversed(laid):
            _lift(fn)
