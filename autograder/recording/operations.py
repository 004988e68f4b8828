"""What one side can ask of an object on the other side, and how the answer crosses."""
from __future__ import annotations

import operator

from .errors import Divergence

BINARY = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor", "lshift",
    "rshift", "lt", "le", "gt", "ge", "eq", "ne", "getitem", "contains", "delitem")}
UNARY = {"len": len, "iter": iter, "next": next, "bool": bool, "repr": repr, "str": str, "int": int,
         "float": float, "index": operator.index, "neg": operator.neg, "abs": abs, "hash": hash,
         "enter": lambda o: o.__enter__()}


def apply(target, op: str, name, args, kwargs):
    if op == "call":
        return target(*args, **kwargs)
    if op == "getattr":
        return getattr(target, name)
    if op == "setattr":
        setattr(target, name, args[0])
        return None
    if op == "delattr":
        delattr(target, name)
        return None
    if op == "setitem":
        target[args[0]] = args[1]
        return None
    if op == "exit":
        return target.__exit__(*args)
    if op == "rop":  # reflected binary operator: args[0] <op> target
        return BINARY[name](args[0], target)
    if op in BINARY:
        if op == "contains":
            return args[0] in target
        return BINARY[op](target, args[0])
    if op in UNARY:
        return UNARY[op](target)
    raise Divergence(f"unknown operation {op!r}")


# What student code may do to the grader's objects. A call back into the grader is re-done in
# the grader's own process at replay, with arguments read from the record (which the student can
# write): so only what `autograder.callbacks` allows (no dunder attribute: `__class__.__base__.
# __subclasses__()` leads to `os.system`; no call but the engine's own code that does no I/O and
# builtin containers' methods; no handle on a module, class, path or library method). Single-
# underscore names stay allowed: course_lib's own code runs on the student's side too (an engine
# the student builds reads a model's `_parameters`).


_OP_REFUSAL = []  # autograder.callbacks.op_refusal, imported on first use (it imports the engine)


def callback_refusal(op: str, name, target=None) -> str | None:
    """Why the grader refuses this use of its object `target` (None if it is allowed)."""
    if not _OP_REFUSAL:
        from ..callbacks import op_refusal

        _OP_REFUSAL.append(op_refusal)
    return _OP_REFUSAL[0](op, name, target)


_MUTABLE = (list, dict, set)


def _holds_containers(values) -> bool:
    return any(type(x) in _MUTABLE or (type(x) is tuple and _holds_containers(x)) for x in values)


def crossing(op: str, target, args, result):
    """How the result of the student's `op` on a grader object crosses (the same rule in both runs,
    on the grader's own objects): ("live", result) for a container it holds (grader state: the
    student's changes to it must reach it), ("snapshot", elements) for iterating a container of
    non-containers, ("copy", result) otherwise (a fresh value: nobody else can see it change)."""
    if op == "iter" and type(target) in (list, tuple, set, frozenset, dict) and not _holds_containers(target):
        return "snapshot", list(target)
    if type(result) not in _MUTABLE:
        return "copy", result
    if op in ("getattr", "next") or (op == "getitem" and not isinstance(args[0], slice)):
        return "live", result
    if op == "call" and type(getattr(target, "__self__", None)) in _MUTABLE:  # dict.get, setdefault, pop
        return "live", result
    return "copy", result
