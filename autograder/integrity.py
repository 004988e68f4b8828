"""The grader's guard inside the student's kernel.

`python -m autograder grade` (and the nbgrader preprocessors in `autograder.nbgrader_plugin`)
rewrite the notebook before executing it:

1. a setup cell runs FIRST, before any submission code: `install(name)` imports the checks and
   what they rely on (course_lib, torch, numpy), snapshots every function and class they could
   be fooled through (builtins, torch / numpy callables, torch.Tensor methods, every course_lib
   and autograder function with its code object and defaults, the import machinery), and binds
   the guard in `builtins` under a name drawn at random for this grading run;
2. every graded test cell is wrapped: first `<name>("<grade_id>")`, then the cell's own code,
   then `<name>.done("<grade_id>", "<token>")`, where the token is random per cell and run.

The guard, at the top of a test cell: compares everything with the snapshot, restores what was
changed (and records the change as a violation), restores sys.stdout / stderr, clears trace and
profile hooks, and re-executes the autograder's modules from disk (so their state is fresh).
At the end of the cell `done` compares again (student code runs *during* the check and could
patch things then), and only if nothing was tampered with prints the completion marker
`[autograder] <grade_id> ok <token>`. The grader gives a cell credit only if it ran without
error AND printed that exact marker; any violation fails the cell with "integrity violation: ..."
and the grader then withholds every graded cell of that notebook.

What it cannot do: code running in the same process can, with enough determination, reach
anything (the snapshot included). The grader therefore also scans the submission's code for
what touches the grader or the interpreter (see `autograder.grade.scan_source`), checks the
course files on disk before and after each notebook, and reports all of it in the feedback.
"""
from __future__ import annotations

import builtins
import importlib
import sys
import types

# Checks are reloaded in this order (dependencies first: `_checking` re-exports the helper modules'
# names, so they are fresh before it); the guard never reloads itself.
_RELOAD_FIRST = ("autograder.user_code", "autograder.check_failures", "autograder.check_values",
                 "autograder.reference_refusal", "autograder.check_hooks", "autograder._checking",
                 "autograder.fixtures", "autograder.checks")

_STDLIB_OWNERS = ("math", "operator", "random", "functools", "itertools", "copy")
_THIRD_PARTY_OWNERS = ("torch", "torch.nn.functional", "torch.testing", "numpy", "numpy.testing")


def _is_builtin_callable(value) -> bool:
    return isinstance(value, (types.BuiltinFunctionType, type))


def _protected_objects():
    """(label, namespace object) pairs whose callables must not change."""
    out = []
    for name in _STDLIB_OWNERS + _THIRD_PARTY_OWNERS:
        mod = sys.modules.get(name)
        if mod is not None:
            out.append((name, mod))
    torch = sys.modules.get("torch")
    if torch is not None:
        out.append(("torch.Tensor", torch.Tensor))
        out.append(("torch._C.TensorBase", torch._C.TensorBase))
    np = sys.modules.get("numpy")
    if np is not None:
        out.append(("numpy.ndarray", np.ndarray))
    random = sys.modules.get("random")
    if random is not None:
        out.append(("random.Random", random.Random))
    return out


def _own_modules():
    """course_lib and autograder modules loaded now (the guard itself excluded)."""
    return sorted((name, mod) for name, mod in list(sys.modules.items())
                  if mod is not None and (name == "course_lib" or name.startswith("course_lib.")
                                          or name == "autograder" or name.startswith("autograder."))
                  and name != __name__)


def _function_state(value):
    func = getattr(value, "__func__", value)
    if isinstance(func, property):
        return tuple(_function_state(f) for f in (func.fget, func.fset))
    if isinstance(func, types.FunctionType):
        return (func.__code__, func.__defaults__, func.__kwdefaults__ and tuple(func.__kwdefaults__.items()))
    return None


class _Snapshot:
    def __init__(self):
        self.builtins = {k: v for k, v in vars(builtins).items()
                         if _is_builtin_callable(v) and (not k.startswith("_") or k in ("__import__", "__build_class__"))}
        self.third_party = {label: {k: v for k, v in vars(obj).items()
                                    if callable(v) and not isinstance(v, types.ModuleType)}
                            for label, obj in _protected_objects()}
        self.third_party_objects = dict(_protected_objects())
        self.modules: dict[str, types.ModuleType] = {}
        self.namespaces: dict[str, tuple[object, dict]] = {}
        for name, mod in _own_modules():
            self.add_module(name, mod)
        self.meta_path = list(sys.meta_path)
        self.path_hooks = list(sys.path_hooks)
        self.stdout, self.stderr = sys.stdout, sys.stderr

    def add_module(self, name, mod):
        self.modules[name] = mod
        self.namespaces[name] = (mod, self._callables(mod))
        for attr, value in list(vars(mod).items()):
            if isinstance(value, type) and value.__module__ == name:
                self.namespaces[f"{name}.{attr}"] = (value, self._callables(value))

    @staticmethod
    def _callables(obj):
        out = {}
        for k, v in list(vars(obj).items()):
            if isinstance(v, types.ModuleType):
                continue
            if callable(v) or isinstance(v, (property, staticmethod, classmethod)):
                out[k] = (v, _function_state(v))
        return out

    # -- compare and restore -------------------------------------------------------------------
    def check_and_restore(self) -> list[str]:
        changes = []
        current = vars(builtins)
        for k, v in self.builtins.items():
            if current.get(k) is not v:
                changes.append(f"builtins.{k} was replaced")
                setattr(builtins, k, v)
        for label, saved in self.third_party.items():
            obj = self.third_party_objects[label]
            now = vars(obj)
            for k, v in saved.items():
                if now.get(k) is not v:
                    changes.append(f"{label}.{k} was replaced")
                    try:
                        setattr(obj, k, v)
                    except (AttributeError, TypeError):
                        pass
        for name, mod in self.modules.items():
            if sys.modules.get(name) is not mod:
                changes.append(f"sys.modules[{name!r}] was replaced")
                sys.modules[name] = mod
        for label, (obj, saved) in self.namespaces.items():
            now = vars(obj)
            for k, (v, state) in saved.items():
                if now.get(k) is not v:
                    changes.append(f"{label}.{k} was replaced")
                    setattr(obj, k, v)
                elif state is not None and _function_state(v) != state:
                    changes.append(f"{label}.{k} was modified (its code or defaults)")
                    _restore_function(v, state)
            if isinstance(obj, type):
                for k, v in list(now.items()):
                    if k not in saved and callable(v) and not k.startswith("__"):
                        changes.append(f"{label}.{k} was added")
                        delattr(obj, k)
        if sys.meta_path != self.meta_path or sys.path_hooks != self.path_hooks:
            changes.append("the import system (sys.meta_path / sys.path_hooks) was changed")
            sys.meta_path[:] = self.meta_path
            sys.path_hooks[:] = self.path_hooks
        return changes


def _restore_function(value, state):
    func = getattr(value, "__func__", value)
    if isinstance(func, property) or not isinstance(func, types.FunctionType):
        return
    code, defaults, kwdefaults = state
    func.__code__, func.__defaults__ = code, defaults
    func.__kwdefaults__ = dict(kwdefaults) if kwdefaults else None


def check_reload_order(names) -> list[str]:
    """The order the guard reloads a notebook's check package in: its `_shared` module first, then one
    file per exercise (each imports only `_shared`), then the package, whose names must be the fresh
    checks (a package reloaded before its files would keep handing out the old ones)."""
    def key(name):
        parts = name.split(".")
        leaf = parts[3] if len(parts) > 3 else None
        return (".".join(parts[:3]), 2 if leaf is None else 0 if leaf.startswith("_") else 1, name)

    return sorted(names, key=key)


def _import_everything_checked():
    """What the checks use, imported before any submission code can run."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import autograder.checks as checks

    names = [f"autograder.checks.{name}" for name in checks.MODULES]
    names += ["course_lib.engine", "course_lib.runner", "course_lib.attention", "course_lib.sim.metrics",
              "course_lib.sim.workload", "course_lib.kv.prefix_cache", "course_lib.scheduler.static"]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # a module that moved: the check that needs it will say so
            pass
    # From here on, a module's code run a second time (a copy of course_lib's functions) is seen.
    from autograder.call_tripwire import watch_module_runs

    watch_module_runs()


def install(name: str) -> None:
    """Called by the grader's setup cell, before any submission code runs."""
    _import_everything_checked()
    snapshot = _Snapshot()
    violations: list[str] = []
    reload = importlib.reload
    print_ = builtins.print
    assertion_error = AssertionError
    setattr_, getattr_ = builtins.setattr, builtins.getattr

    def _reset_hooks():
        if sys.gettrace() is not None:
            sys.settrace(None)
        if sys.getprofile() is not None:
            sys.setprofile(None)
        sys.stdout, sys.stderr = snapshot.stdout, snapshot.stderr

    def _fail():
        raise assertion_error("integrity violation: " + "; ".join(dict.fromkeys(violations))[:1500]
                              + ". The grader restored the original code; no credit for this notebook's graded cells.")

    def guard(grade_id: str = "") -> None:
        """Top of a graded test cell."""
        _reset_hooks()
        violations.extend(snapshot.check_and_restore())
        # Fresh check modules from disk: nothing the submission did to them (or their caches) survives.
        names = [n for n in _RELOAD_FIRST if n in sys.modules]
        names += check_reload_order(n for n in sys.modules if n.startswith("autograder.checks.") and n not in names)
        for module_name in names:
            module = reload(sys.modules[module_name])
            snapshot.add_module(module_name, module)
        if violations:
            _fail()

    def done(grade_id: str, token: str) -> None:
        """Bottom of a graded test cell: reached only if the checks raised nothing."""
        _reset_hooks()
        violations.extend(snapshot.check_and_restore())
        if violations:
            _fail()
        print_(f"[autograder] {grade_id} ok {token}", flush=True)

    guard.done = done
    guard.violations = violations
    setattr_(builtins, name, guard)
