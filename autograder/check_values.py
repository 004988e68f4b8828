"""The check's inputs and the student's results, as plain data: credit needs the student's own computation.

The student's code can change what it is handed (a list appended to, a config's field set, a tensor
written into, a request's fields rewritten through the grader's own object), so an expected value
computed afterwards from those objects could be made to agree with a wrong answer. So: every expected
value comes from the grader's own copy (`pristine`, made before the call, never handed over); what was
handed over is held to that copy afterwards (`expect_unchanged`), and a result is compared by value, as
plain data of exact types (`plain_int`, `plain_float`, `difference`): an object of the student's own
class (through the grading membrane: a proxy) never answers for a value.
"""
from __future__ import annotations

import copy

from .check_failures import broke

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


def expect_unchanged(shown: str, what: str, handed, kept, rule: str) -> None:
    """Fail unless `handed` (what the student's code was given) still equals `kept` (the grader's
    own copy of it, made before the call): a function must not change the check's inputs. `rule`: the
    name of the notebook's rule that says so, which the failure names (a student is held only to a
    rule the notebook states)."""
    found = difference(handed, kept, f"`{what}`")
    if found:
        found = found.replace(" expected ", " it was ", 1)
        broke(rule, f"{shown} changed the check's input `{what}` ({found}): your code must leave what it is given "
                    f"as it was (compute on a copy); the check's expected answer comes from its own copy of "
                    f"`{what}`, never from what your code hands back")
