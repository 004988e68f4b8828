"""The boundary between a check and the student's code, recorded as plain data and replayed.

A check talks to student code through objects: it calls the adapter, calls methods on what that
returns, reads attributes, plugs it into an engine that calls it in turn; and student code calls
back into the grader's objects (an engine, a model, a request, a kv manager). A `Membrane` stands
between the two worlds:

- every student object the grader's side sees is a proxy (an *S-handle*), every grader object
  the student's side sees is a proxy too (a *G-handle*), each numbered in order of appearance;
- values that are data (None, bool, int, float, str, bytes, tuples, lists, dicts, sets, tensors,
  numpy arrays, course_lib enums and course_lib dataclasses) cross as copies, never as live objects,
  with one exception: a list, dict or set the student's side *reaches inside* a grader object (an
  attribute, an item, the next element, what a container's own method hands out: a request's
  `output_token_ids`, a kv manager's `tables`) is grader state, and crosses live as a G-handle, so
  that the student's `output.append(token)` changes the grader's own list (an `O` event, re-done in
  replay) instead of a copy that nobody reads; iterating a grader container whose elements are not
  containers themselves takes one snapshot (one event) rather than one event per element. A
  grader object's own state (a course_lib `Request`) is never copied to the student's side: it is
  a G-handle, so every change the student's code (or course_lib code it inherits, running on the
  student's side) makes to it is an event;
- in RECORD mode (inside the sandbox, in the student's kernel) each crossing is an event: the
  grader's side asks (`S`: handle, operation, a digest of the arguments) and the student's side
  answers (`Sr` with the result, or `Sx` with the exception), and in between the student's code
  may ask the grader's side (`O`: handle, operation, the arguments in full) and get answers
  (`Or` / `Ox`);
- in REPLAY mode (in the grader's own process) the same check runs on the same seed against a
  stub: each question the check asks must be the next `S` event (same handle, operation and
  argument digest), the student's calls back into the grader's objects are re-done on the
  grader's real objects (so an engine's state, a model's forward passes, a pool's pages evolve
  exactly as they did), and the answer is the recorded one. The verdict is the replay's.

A record that does not match what the check asks raises `Divergence`, a BaseException so that a
check's `except Exception` cannot mistake it for the student's error; once diverged, the membrane
stays poisoned and the verdict is a failure. Nothing read from a record is ever unpickled:
tensors travel as raw little-endian bytes (base64) with dtype and shape.
"""
from __future__ import annotations

import base64
import builtins
import collections
import dataclasses
import decimal
import enum
import fractions
import hashlib
import json
import math
import operator
import random
import sys
import threading

import numpy as np
import torch

MAX_EVENTS = 400_000  # per check call: a record longer than this is cut (and fails in replay)
MAX_TENSOR_BYTES = 64 << 20
MAX_DIGESTS = 4096  # tensors whose digest one check call keeps (a model's weights are a few dozen)


class Divergence(BaseException):
    """The record does not answer the question the check asks (forged, truncated or nondeterministic)."""


class RecordLimit(BaseException):
    """A check call produced more events than MAX_EVENTS."""


_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
_NP_DTYPES = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
              "uint64", "bool", "complex64", "complex128"}


# ---------------------------------------------------------------------------------------------
# Operations: what one side can ask of an object on the other side
# ---------------------------------------------------------------------------------------------

_BINARY = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor", "lshift",
    "rshift", "lt", "le", "gt", "ge", "eq", "ne", "getitem", "contains", "delitem")}
_UNARY = {"len": len, "iter": iter, "next": next, "bool": bool, "repr": repr, "str": str, "int": int,
          "float": float, "index": operator.index, "neg": operator.neg, "abs": abs, "hash": hash,
          "enter": lambda o: o.__enter__()}


def _apply(target, op: str, name, args, kwargs):
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
        return _BINARY[name](args[0], target)
    if op in _BINARY:
        if op == "contains":
            return args[0] in target
        return _BINARY[op](target, args[0])
    if op in _UNARY:
        return _UNARY[op](target)
    raise Divergence(f"unknown operation {op!r}")


# What student code may do to the grader's objects. A call back into the grader is re-done in
# the grader's own process at replay, with arguments read from the record (which the student can
# write): so only what `autograder.callbacks` allows (no dunder attribute: `__class__.__base__.
# __subclasses__()` leads to `os.system`; no call but the engine's own code that does no I/O and
# builtin containers' methods; no handle on a module, class, path or library method). Single-
# underscore names stay allowed: course_lib's own code runs on the student's side too (an engine
# the student builds reads a model's `_parameters`).


def callback_refusal(op: str, name, target=None) -> str | None:
    """Why the grader refuses this use of its object `target` (None if it is allowed)."""
    from .callbacks import op_refusal

    return op_refusal(op, name, target)


class Refused(TypeError):
    """What a callback returned may not cross to the student's code (autograder.callbacks.hold_refusal)."""


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


# ---------------------------------------------------------------------------------------------
# Proxies
# ---------------------------------------------------------------------------------------------

_M, _H, _SIDE = "_ag_membrane", "_ag_handle", "_ag_side"


def _op(self, op, name=None, args=(), kwargs=None):
    m = object.__getattribute__(self, _M)
    return m.dispatch(object.__getattribute__(self, _SIDE), object.__getattribute__(self, _H), op, name,
                      args, kwargs or {})


class Proxy:
    """Stands for an object of the other world; every use of it is one membrane operation."""

    __slots__ = (_M, _H, _SIDE, "__weakref__")

    def __getattr__(self, name):
        if name.startswith("_ag_"):
            raise AttributeError(name)
        return _op(self, "getattr", name)

    def __setattr__(self, name, value):
        _op(self, "setattr", name, (value,))

    def __delattr__(self, name):
        _op(self, "delattr", name)

    @property
    def __class__(self):  # isinstance() on a proxy sees the object's own class where that is known
        m = object.__getattribute__(self, _M)
        return m.class_of(object.__getattribute__(self, _SIDE), object.__getattribute__(self, _H))

    def __hash__(self):  # identity hash, local: the same in both runs
        return hash((object.__getattribute__(self, _SIDE), object.__getattribute__(self, _H)))

    def __eq__(self, other):
        if isinstance(other, Proxy) and object.__getattribute__(self, _M).identity_eq(self):
            return self is other
        _compared(self)
        return _op(self, "eq", None, (other,))

    def __ne__(self, other):
        result = self.__eq__(other)
        return not result if isinstance(result, bool) else result

    def __len__(self):
        return _op(self, "len")

    def __iter__(self):
        return _op(self, "iter")

    def __next__(self):
        return _op(self, "next")

    def __bool__(self):
        return _op(self, "bool")

    def __repr__(self):
        return _op(self, "repr")

    def __str__(self):
        return _op(self, "str")

    def __int__(self):
        return _op(self, "int")

    def __float__(self):
        return _op(self, "float")

    def __index__(self):
        return _op(self, "index")

    def __neg__(self):
        return _op(self, "neg")

    def __abs__(self):
        return _op(self, "abs")

    def __getitem__(self, key):
        return _op(self, "getitem", None, (key,))

    def __setitem__(self, key, value):
        _op(self, "setitem", None, (key, value))

    def __delitem__(self, key):
        _op(self, "delitem", None, (key,))

    def __contains__(self, item):
        return _op(self, "contains", None, (item,))

    def __enter__(self):
        return _op(self, "enter")

    def __exit__(self, *exc):
        return _op(self, "exit", None, exc)


def _compared(proxy):
    """The check compares a student object (not data) with a value: the student's own __eq__ or
    __lt__ would answer, and an object equal to everything would pass. Refused, in both runs."""
    if object.__getattribute__(proxy, _SIDE) == "S":
        object.__getattribute__(proxy, _M).refuse_comparison(object.__getattribute__(proxy, _H))


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def _binary(name):
    def forward(self, other):
        if name in _COMPARISONS:
            _compared(self)
        return _op(self, name, None, (other,))

    def reflected(self, other):
        return _op(self, "rop", name, (other,))

    return forward, reflected


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor",
              "lshift", "rshift", "lt", "le", "gt", "ge"):
    _fwd, _ref = _binary(_name)
    _dunder = _name.rstrip("_")
    setattr(Proxy, f"__{_dunder}__", _fwd)
    if _name not in ("lt", "le", "gt", "ge"):
        setattr(Proxy, f"__r{_dunder}__", _ref)


class CallableProxy(Proxy):
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _op(self, "call", None, args, kwargs)


def _new_proxy(m, side, handle, is_callable):
    p = object.__new__(CallableProxy if is_callable else Proxy)
    object.__setattr__(p, _M, m)
    object.__setattr__(p, _H, handle)
    object.__setattr__(p, _SIDE, side)
    return p


def is_proxy(obj) -> bool:
    return type(obj) in (Proxy, CallableProxy)


def proxy_target(obj):
    """The real object behind a RECORD-mode student proxy (None for stubs and grader proxies)."""
    m = object.__getattribute__(obj, _M)
    if object.__getattribute__(obj, _SIDE) != "S" or m.mode != "record":
        return None
    return m.s_objs[object.__getattribute__(obj, _H)]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def _tensor_stamp(t: torch.Tensor):
    """(version counter, storage address): equal while the tensor is unchanged; None when the tensor
    keeps no version counter (an inference-mode tensor), so that its digest is never reused."""
    try:
        return (t._version, t.data_ptr())
    except RuntimeError:
        return None


def _tensor_bytes(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    t = t.detach().to("cpu").contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype == "bfloat16":
        data = t.view(torch.int16).numpy().tobytes()
    else:
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
    return dtype, list(t.shape), data


def _tensor_from(enc) -> torch.Tensor:
    dtype, shape = enc["dtype"], enc["shape"]
    if dtype not in _TORCH_DTYPES or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise Divergence(f"bad tensor in the record ({dtype!r}, {shape!r})")
    data = base64.b64decode(enc["data"])
    if len(data) > MAX_TENSOR_BYTES:
        raise Divergence("a tensor in the record is larger than the limit")
    if dtype == "bfloat16":
        arr = np.frombuffer(data, dtype="<i2").copy()
        return torch.from_numpy(arr).view(torch.bfloat16).reshape(shape)
    np_dtype = np.dtype(torch.empty(0, dtype=_TORCH_DTYPES[dtype]).numpy().dtype).newbyteorder("<")
    arr = np.frombuffer(data, dtype=np_dtype).astype(np_dtype.newbyteorder("="))
    if arr.size != math.prod(shape):
        raise Divergence("a tensor in the record has the wrong number of elements")
    return torch.from_numpy(arr.copy()).reshape(shape)


def _course_class(obj_type) -> str | None:
    mod = getattr(obj_type, "__module__", "") or ""
    if mod == "course_lib" or mod.startswith("course_lib."):
        return f"{mod}:{obj_type.__qualname__}"
    return None


def _load_course_class(spec):
    """A course_lib class the grader has already imported, by "module:Name" (the record names it:
    nothing is ever imported for it, only looked up)."""
    if not isinstance(spec, str) or ":" not in spec or len(spec) > 200:
        raise Divergence(f"bad class name in the record: {str(spec)[:80]!r}")
    mod, qual = spec.split(":", 1)
    if not (mod == "course_lib" or mod.startswith("course_lib.")) or "." in qual:
        raise Divergence(f"the record names a class outside course_lib: {spec!r}")
    klass = getattr(sys.modules.get(mod), qual, None)
    if not (isinstance(klass, type) and klass.__module__ == mod and klass.__qualname__ == qual):
        raise Divergence(f"the record names an unknown class {spec!r}")
    return klass


_TAGS = {"S", "G", "i", "f", "T", "L", "D", "Set", "FSet", "B", "tensor", "nd", "np", "dtype", "device", "slice",
         "range", "E", "DC"}
# Classes of the standard library a student object may show as its class to isinstance() in the
# grader (harmless: every use of the object still goes through the record), by exact name.
_SHOWN_CLASSES = {f"{k.__module__}:{k.__qualname__}": k for k in (
    random.Random, collections.OrderedDict, collections.defaultdict, collections.Counter, collections.deque,
    fractions.Fraction, decimal.Decimal)}


def _shown_class(obj) -> str | None:
    klass = type(obj)
    spec = f"{getattr(klass, '__module__', '')}:{getattr(klass, '__qualname__', '')}"
    if spec in _SHOWN_CLASSES or _course_class(klass):
        return spec
    return None


def _load_shown_class(spec):
    if not isinstance(spec, str):
        return None
    if spec in _SHOWN_CLASSES:
        return _SHOWN_CLASSES[spec]
    try:
        return _load_course_class(spec)
    except Divergence:
        return None


def _class_name(klass) -> str:
    """The student's class's name, as the messages show it (read without running its code)."""
    try:
        name = type.__dict__["__qualname__"].__get__(klass)
    except Exception:  # noqa: BLE001
        name = "?"
    return str(name)[:100]


def digest(enc) -> str:
    return hashlib.sha256(json.dumps(enc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def _float(x: float):
    if math.isfinite(x):
        return x
    return {"f": repr(x)}


_SAFE_INT = 2 ** 53  # (JSON readers lose integers beyond it: larger ones travel as text)


def _is_plain(x) -> bool:
    """A value that crosses as itself (a JSON scalar, both ways): the containers' fast path, which
    skips a call of the general encoder per item (a scheduler's check sends ~40,000 values)."""
    t = type(x)
    return (t is str or x is None or t is bool or (t is int and -_SAFE_INT < x < _SAFE_INT)
            or (t is float and math.isfinite(x)))


# What JSON gives back for a plain value (exact types: nothing else is read as itself).
_PLAIN_DECODED = frozenset({str, int, float, bool, type(None)})


class Membrane:
    def __init__(self, mode: str, events: list | None = None, exercise: str | None = None):
        if mode not in ("record", "replay"):
            raise ValueError(f"mode must be record or replay, got {mode!r}")
        self.mode = mode
        self.exercise = exercise  # the check's adapter name, for the messages
        self.vetting = False  # encoding a callback's result: what may not cross is refused
        self.events: list = [] if events is None else events
        self.pos = 0
        self.poisoned: str | None = None
        self.g_objs: list = []  # G-handle -> the grader's real object
        self.g_ids: dict[int, int] = {}
        self.g_proxies: dict[int, Proxy] = {}
        self.s_objs: list = []  # S-handle -> the student's real object (record mode)
        self.s_info: dict[int, dict] = {}  # S-handle -> {"c": callable, "t": is a class}
        self.s_ids: dict[int, int] = {}
        self.s_proxies: dict[int, Proxy] = {}
        self.depth = 0  # S-operations in progress (student code may only call back inside one)
        # id -> (tensor, version, pointer, digest): a model's weights cross at every forward pass the
        # student's engine makes (their digest was a quarter of recording nb00's check); an unchanged
        # tensor (same version counter, same storage) keeps its digest. The record and the replay
        # both use it, so they agree; the verdict never reads a digest, only the check's values.
        self.digests: dict[int, tuple] = {}
        self.thread = threading.get_ident()
        self.hook_values: list = []

    # -- handles ---------------------------------------------------------------------------------
    def root(self, impl=None, info: dict | None = None):
        """The proxy the check receives for the student's adapter (S-handle 0)."""
        if self.mode == "record":
            return self._s_proxy(self._register_s(impl))
        self.s_info[0] = dict(info or {"c": True})
        return self._s_proxy(0)

    def _register_s(self, obj) -> int:
        key = id(obj)
        if key in self.s_ids:
            return self.s_ids[key]
        h = len(self.s_objs)
        self.s_objs.append(obj)
        self.s_ids[key] = h
        self.s_info[h] = {"c": callable(obj), "t": isinstance(obj, type), "n": _class_name(type(obj))}
        shown = _shown_class(obj)
        if shown:
            self.s_info[h]["k"] = shown
        return h

    def _register_g(self, obj) -> int:
        key = id(obj)
        if key in self.g_ids:
            return self.g_ids[key]
        h = len(self.g_objs)
        self.g_objs.append(obj)
        self.g_ids[key] = h
        return h

    def _s_proxy(self, h: int):
        if h not in self.s_proxies:
            info = self.s_info.setdefault(h, {"c": True})
            self.s_proxies[h] = _new_proxy(self, "S", h, bool(info.get("c")))
        return self.s_proxies[h]

    def _g_proxy(self, h: int):
        if h not in self.g_proxies:
            self.g_proxies[h] = _new_proxy(self, "G", h, callable(self.g_objs[h]))
        return self.g_proxies[h]

    def class_of(self, side, h):
        if side == "G":
            return type(self.g_objs[h])
        info = self.s_info.get(h, {})
        if info.get("t"):
            return type  # a student class: isinstance(impl, type) holds in both runs
        if info.get("k"):
            klass = _load_shown_class(info["k"])
            if klass is not None:
                return klass
        return CallableProxy if self.s_info.get(h, {}).get("c") else Proxy

    def refuse_comparison(self, h):
        from ._checking import fail

        check = f"check_{self.exercise}" if self.exercise else "the check"
        fail(f"{check} compares what your code returned: return plain values (int, float, str, list, tuple, "
             f"dict, tensor), not an object of class {self.s_info.get(h, {}).get('n') or '?'}")

    def identity_eq(self, proxy) -> bool:
        side, h = object.__getattribute__(proxy, _SIDE), object.__getattribute__(proxy, _H)
        if side == "S":
            return True
        return type(self.g_objs[h]).__eq__ is object.__eq__

    # -- encoding: what crosses, as JSON-able data --------------------------------------------------
    def encode(self, value, owner: str, full_tensors: bool):
        """`owner` is the world the value comes from ("G" or "S"): its unknown objects become its handles."""
        return self._enc(value, owner, full_tensors, 0)

    def _enc(self, v, owner, full, depth):
        if depth > 60:
            raise Divergence("a value crossing the boundary is nested too deeply")
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            return v if abs(v) < 2 ** 53 else {"i": str(v)}
        if t is float:
            return _float(v)
        if t is Proxy or t is CallableProxy:
            side, h = object.__getattribute__(v, _SIDE), object.__getattribute__(v, _H)
            if object.__getattribute__(v, _M) is not self:
                raise Divergence("a proxy of another check call crossed the boundary")
            return {"S": h, **self.s_info.get(h, {})} if side == "S" else {"G": h}
        if t is tuple or t is list:
            return {"T" if t is tuple else "L": [x if _is_plain(x) else self._enc(x, owner, full, depth + 1)
                                                 for x in v]}
        if t is dict:
            return {"D": [[k if _is_plain(k) else self._enc(k, owner, full, depth + 1),
                           x if _is_plain(x) else self._enc(x, owner, full, depth + 1)] for k, x in v.items()]}
        if t is set or t is frozenset:
            items = [self._enc(x, owner, full, depth + 1) for x in v]
            items.sort(key=lambda e: json.dumps(e, sort_keys=True))
            return {"Set" if t is set else "FSet": items}
        if t is bytes:
            return {"B": base64.b64encode(v).decode()}
        if isinstance(v, torch.Tensor) and t in (torch.Tensor, torch.nn.Parameter):
            stamp = _tensor_stamp(v) if not full else None
            if stamp is not None:
                known = self.digests.get(id(v))
                if known is not None and known[0] is v and known[1] == stamp:
                    return dict(known[2])
            dtype, shape, data = _tensor_bytes(v)
            if len(data) > MAX_TENSOR_BYTES:
                raise RecordLimit("a tensor larger than the record's limit crossed the boundary")
            enc = {"tensor": dtype, "shape": shape}
            if full:
                enc["data"] = base64.b64encode(data).decode()
            else:
                enc["sha"] = hashlib.sha256(data).hexdigest()[:32]
                if stamp is not None and len(self.digests) < MAX_DIGESTS:
                    self.digests[id(v)] = (v, stamp, dict(enc))
            return enc
        if isinstance(v, np.ndarray) and v.dtype.name in _NP_DTYPES:
            return {"nd": self._enc(torch.from_numpy(np.ascontiguousarray(v)), owner, full, depth + 1)}
        if isinstance(v, np.generic) and v.dtype.name in _NP_DTYPES:
            return {"np": v.dtype.name, "v": self._enc(v.item(), owner, full, depth + 1)}
        if t is torch.dtype:
            return {"dtype": str(v)}
        if t is torch.device:
            return {"device": str(v)}
        if t is slice:
            return {"slice": [self._enc(x, owner, full, depth + 1) for x in (v.start, v.stop, v.step)]}
        if t is range:
            return {"range": [v.start, v.stop, v.step]}
        if isinstance(v, enum.Enum) and _course_class(t):
            return {"E": _course_class(t), "n": v.name}
        if owner == "S" and dataclasses.is_dataclass(v) and not isinstance(v, type) and _course_class(t):
            return {"DC": _course_class(t),
                    "fields": {f.name: self._enc(getattr(v, f.name), owner, full, depth + 1)
                          for f in dataclasses.fields(v) if hasattr(v, f.name)}}
        if owner == "G":
            if self.vetting and id(v) not in self.g_ids:
                from .callbacks import hold_refusal

                refused = hold_refusal(v)
                if refused:
                    raise Refused(refused)
            return {"G": self._register_g(v)}
        h = self._register_s(v)
        return {"S": h, **self.s_info[h]}

    def decode(self, enc, world: str):
        """An encoding as the `world` ("G": the grader, "S": the student, record mode only) sees it."""
        return self._dec(enc, world, 0)

    def _dec(self, e, world, depth):
        if depth > 60:
            raise Divergence("the record is nested too deeply")
        if e is None or isinstance(e, (bool, str, float)):
            return e
        if isinstance(e, int):
            return e
        if isinstance(e, list):
            raise Divergence("a bare list in the record")
        if not isinstance(e, dict) or len(e) == 0:
            raise Divergence(f"a malformed value in the record: {str(e)[:80]}")
        if len(e) == 1 and ("L" in e or "T" in e):  # (the common case, read without a call per item)
            items = self._items(e.get("L", e.get("T")))
            out = [x if type(x) in _PLAIN_DECODED else self._dec(x, world, depth + 1) for x in items]
            return out if "L" in e else tuple(out)
        d = lambda x: self._dec(x, world, depth + 1)  # noqa: E731
        if len(e) > 5 or _TAGS.isdisjoint(e):
            raise Divergence(f"a malformed value in the record: {str(e)[:80]}")
        if "DC" in e or "E" in e:
            return self._dec_course(e, d)
        if "S" in e:
            h = e["S"]
            if not isinstance(h, int) or h < 0 or h > 10_000_000:
                raise Divergence("a malformed student handle in the record")
            if world == "S":
                return self.s_objs[h]
            if h not in self.s_info:
                self.s_info[h] = {"c": bool(e.get("c", False)), "t": bool(e.get("t", False))}
                if isinstance(e.get("n"), str):
                    self.s_info[h]["n"] = e["n"][:100]
                if isinstance(e.get("k"), str):
                    self.s_info[h]["k"] = e["k"][:200]
            return self._s_proxy(h)
        if "G" in e:
            h = e["G"]
            if not isinstance(h, int) or not 0 <= h < len(self.g_objs):
                raise Divergence(f"the record refers to grader object #{h}, which the check never handed over")
            return self._g_proxy(h) if world == "S" else self.g_objs[h]
        if "i" in e:
            return int(e["i"])
        if "f" in e:
            if e["f"] not in ("nan", "inf", "-inf"):
                raise Divergence("a malformed float in the record")
            return float(e["f"])
        if "T" in e:
            return tuple(d(x) for x in self._items(e["T"]))
        if "L" in e:
            return [d(x) for x in self._items(e["L"])]
        if "D" in e:
            out = {}
            for pair in self._items(e["D"]):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise Divergence("a malformed dict in the record")
                out[d(pair[0])] = d(pair[1])
            return out
        if "Set" in e:
            return {d(x) for x in self._items(e["Set"])}
        if "FSet" in e:
            return frozenset(d(x) for x in self._items(e["FSet"]))
        if "B" in e:
            return base64.b64decode(e["B"])
        if "tensor" in e:
            if "data" not in e:
                raise Divergence("the record holds only a digest of this tensor")
            return _tensor_from({"dtype": e["tensor"], "shape": e.get("shape"), "data": e["data"]})
        if "nd" in e:
            t = d(e["nd"])
            return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if "np" in e:
            if e["np"] not in _NP_DTYPES:
                raise Divergence("a malformed numpy scalar in the record")
            return np.dtype(e["np"]).type(d(e["v"]))
        if "dtype" in e:
            name = str(e["dtype"]).removeprefix("torch.")
            if name not in _TORCH_DTYPES:
                raise Divergence("a malformed dtype in the record")
            return _TORCH_DTYPES[name]
        if "device" in e:
            return torch.device(str(e["device"]))
        if "slice" in e:
            return slice(*[d(x) for x in self._items(e["slice"])][:3])
        if "range" in e:
            r = e["range"]
            if not (isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) for x in r)):
                raise Divergence("a malformed range in the record")
            return range(*r)
        raise Divergence(f"a malformed value in the record: {str(e)[:80]}")

    def _dec_course(self, e, d):
        if "E" in e:
            cls = _load_course_class(e["E"])
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or e.get("n") not in cls.__members__:
                raise Divergence(f"the record names an unknown enum member {e.get('E')}.{e.get('n')}")
            return cls[e["n"]]
        if "DC" in e:
            cls = _load_course_class(e["DC"])
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or not isinstance(e.get("fields"), dict):
                raise Divergence(f"the record names {e['DC']}, not a course_lib dataclass")
            names = {f.name for f in dataclasses.fields(cls)}
            obj = cls.__new__(cls)
            for k, x in e["fields"].items():
                if k not in names:
                    raise Divergence(f"the record gives {e['DC']} an unknown field {k!r}")
                object.__setattr__(obj, k, d(x))
            return obj
        raise Divergence(f"a malformed value in the record: {str(e)[:80]}")

    @staticmethod
    def _items(x):
        if not isinstance(x, list):
            raise Divergence("a malformed container in the record")
        return x

    def to_student(self, value, depth=0, live_tensors=False):
        """RECORD mode: what the student's code receives for a grader value: containers copied, objects
        as proxies; tensors copied for arguments (their changes are recorded) and live for results
        (a forward pass may keep pointers to the weights it reads; a change the student makes to
        them in place is never replayed, so it cannot help the verdict)."""
        t = type(value)
        if value is None or t in (bool, int, float, str, bytes, slice, range, torch.dtype, torch.device):
            return value
        if t is Proxy or t is CallableProxy:
            side, h = object.__getattribute__(value, _SIDE), object.__getattribute__(value, _H)
            return self.s_objs[h] if side == "S" else value
        if t in (tuple, list, set, frozenset):
            return t(self.to_student(x, depth + 1, live_tensors) for x in value)
        if t is dict:
            return {self.to_student(k, depth + 1, live_tensors): self.to_student(x, depth + 1, live_tensors)
                    for k, x in value.items()}
        if isinstance(value, torch.Tensor) and t in (torch.Tensor, torch.nn.Parameter):
            return value if live_tensors else value.detach().clone()
        if isinstance(value, np.ndarray) and value.dtype.name in _NP_DTYPES:
            return value if live_tensors else value.copy()
        if isinstance(value, np.generic) and value.dtype.name in _NP_DTYPES:
            return value
        if isinstance(value, enum.Enum) and _course_class(t):
            return value
        return self._g_proxy(self._register_g(value))

    # -- the event log -----------------------------------------------------------------------------
    def _emit(self, event):
        if len(self.events) >= MAX_EVENTS:
            raise RecordLimit(f"more than {MAX_EVENTS} crossings in one check call")
        self.events.append(event)

    def _next(self, kinds, what):
        if self.poisoned:
            raise Divergence(self.poisoned)
        if self.pos >= len(self.events):
            self._poison(f"the record ends before the check's {what} (after {self.pos} events)")
        ev = self.events[self.pos]
        if not isinstance(ev, dict) or ev.get("k") not in kinds:
            self._poison(f"event {self.pos}: the check's {what} meets {str(ev)[:120]} in the record")
        self.pos += 1
        return ev

    def _poison(self, why: str):
        if not self.poisoned:
            self.poisoned = why
        raise Divergence(self.poisoned)

    def dispatch(self, side, h, op, name, args, kwargs):
        if side == "S":
            return self._s_op(h, op, name, args, kwargs)
        return self._o_op(h, op, name, args, kwargs)

    def _what(self, h, op, name):
        return f"{op} {name}" if name else op

    # -- the grader asks the student ---------------------------------------------------------------
    def _s_op(self, h, op, name, args, kwargs):
        if threading.get_ident() != self.thread:
            raise RuntimeError("the student's objects are used from a thread the grader did not start")
        enc_args = self.encode([list(args), kwargs], "G", full_tensors=False)
        question = {"k": "S", "h": h, "op": op, "n": name, "a": digest(enc_args)}
        if self.mode == "replay":
            ev = self._next(("S",), f"question #{h}.{self._what(h, op, name)}")
            if (ev.get("h"), ev.get("op"), ev.get("n")) != (h, op, name):
                self._poison(f"event {self.pos - 1}: the check asks {self._what(h, op, name)} of student object #{h}, "
                             f"the record answers {ev.get('op')} {ev.get('n') or ''} of #{ev.get('h')}")
            if ev.get("a") != question["a"]:
                self._poison(f"event {self.pos - 1}: the check asks {self._what(h, op, name)} with other arguments "
                             "than the record answers")
            return self._replay_answer(args, kwargs)
        self._emit(question)
        target = self.s_objs[h]
        s_args = [self.to_student(a) for a in args]
        s_kwargs = {k: self.to_student(v) for k, v in kwargs.items()}
        self.depth += 1
        try:
            result = _apply(target, op, name, s_args, s_kwargs)
        except (KeyboardInterrupt, Divergence, RecordLimit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the student's exception is part of the answer
            info = exception_info(exc)
            mutations = self._mutations(args, kwargs, s_args, s_kwargs)
            self._emit({"k": "Sx", "e": info, "m": mutations})
            self._apply_mutations(args, kwargs, mutations)
            raise rebuild_exception(info) from None
        finally:
            self.depth -= 1
        enc = self.encode(result, "S", full_tensors=True)
        mutations = self._mutations(args, kwargs, s_args, s_kwargs)
        self._emit({"k": "Sr", "v": enc, "m": mutations})
        self._apply_mutations(args, kwargs, mutations)
        return self.decode(enc, "G")

    def _mutations(self, args, kwargs, s_args, s_kwargs):
        """Arguments the student's code changed in place (its copies of lists, dicts, tensors)."""
        out = []
        pairs = list(zip(args, s_args)) + [(kwargs[k], s_kwargs[k]) for k in kwargs]
        for i, (orig, mine) in enumerate(pairs):
            if type(orig) not in (list, dict, set) and not (isinstance(orig, torch.Tensor) and type(orig) in
                                                            (torch.Tensor, torch.nn.Parameter)):
                continue
            before = self.encode(orig, "G", full_tensors=False)
            after = self.encode(mine, "S", full_tensors=False)
            if digest(before) != digest(after):
                out.append([i, self.encode(mine, "S", full_tensors=True)])
        return out

    def _apply_mutations(self, args, kwargs, mutations):
        if not isinstance(mutations, list):
            self._poison("malformed argument changes in the record")
        pairs = list(args) + [kwargs[k] for k in kwargs]
        for item in mutations:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and 0 <= item[0] < len(pairs)):
                self._poison("malformed argument changes in the record")
            orig, new = pairs[item[0]], self.decode(item[1], "G")
            try:
                if isinstance(orig, torch.Tensor):
                    with torch.no_grad():
                        orig.copy_(torch.as_tensor(new).reshape(orig.shape).to(orig.dtype))
                elif type(orig) is list and isinstance(new, list):
                    orig[:] = new
                elif type(orig) is dict and isinstance(new, dict):
                    orig.clear()
                    orig.update(new)
                elif type(orig) is set and isinstance(new, set):
                    orig.clear()
                    orig.update(new)
                else:
                    self._poison("an argument change in the record does not fit the argument")
            except (RuntimeError, TypeError, ValueError) as exc:
                self._poison(f"an argument change in the record does not fit the argument ({exc})")

    def _replay_answer(self, args, kwargs):
        """REPLAY: re-do the student's calls back into the grader's objects, then give the answer."""
        while True:
            ev = self._next(("O", "Sr", "Sx"), "answer")
            kind = ev["k"]
            if kind == "O":
                self._replay_callback(ev)
                continue
            self._apply_mutations(args, kwargs, ev.get("m", []))
            if kind == "Sr":
                return self.decode(ev.get("v"), "G")
            raise rebuild_exception(ev.get("e"))

    def _replay_callback(self, ev):
        h, op, name = ev.get("h"), ev.get("op"), ev.get("n")
        if not isinstance(h, int) or not 0 <= h < len(self.g_objs):
            self._poison(f"event {self.pos - 1}: the record calls grader object #{h}, which was never handed over")
        a = ev.get("a")
        if not (isinstance(a, dict) and "L" in a and len(a["L"]) == 2):
            self._poison(f"event {self.pos - 1}: malformed arguments in the record")
        args, kwargs = self.decode(a, "G")
        if not (isinstance(args, list) and isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
            self._poison(f"event {self.pos - 1}: malformed arguments in the record")
        if op not in ("call", "getattr", "setattr", "delattr", "setitem", "exit", "rop") and op not in _BINARY \
                and op not in _UNARY:
            self._poison(f"event {self.pos - 1}: unknown operation {op!r}")
        if op in ("getattr", "setattr", "delattr") and not isinstance(name, str):
            self._poison(f"event {self.pos - 1}: malformed attribute name")
        if op == "rop" and name not in _BINARY:
            self._poison(f"event {self.pos - 1}: unknown operator {name!r}")
        target = self.g_objs[h]
        refused = callback_refusal(op, name, target)
        if refused:  # the recorder never writes such an event: the record was forged
            self._poison(f"event {self.pos - 1}: {refused}")
        self.depth += 1
        try:
            result = _apply(target, op, name, args, kwargs)
            mine = self._enc_result(*crossing(op, target, args, result))  # Refused: as the student saw it
        except (Divergence, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the grader's object refused: the record must say so too
            end = self._next(("Or", "Ox"), "exception")
            recorded = (end.get("e") or {}).get("type") if end["k"] == "Ox" else None
            if recorded != type(exc).__name__:
                self._poison(f"event {self.pos - 1}: the grader's {op} {name or ''} raised {type(exc).__name__}, "
                             "the record says otherwise")
            return
        finally:
            self.depth -= 1
        end = self._next(("Or", "Ox"), "result")
        if end["k"] != "Or":
            self._poison(f"event {self.pos - 1}: the record says the grader's {op} {name or ''} raised, it did not")
        if not _same_shape(mine, end.get("v")):
            self._poison(f"event {self.pos - 1}: the grader's {op} {name or ''} returned something else than "
                         "the record says")

    # -- the student asks the grader (RECORD mode only: in replay no student code runs) --------
    def _o_op(self, h, op, name, args, kwargs):
        if threading.get_ident() != self.thread or self.depth == 0:
            raise RuntimeError("the grader's objects may only be used while the grader is calling your code, "
                               "from the thread it called you on")
        target = self.g_objs[h]
        refused = callback_refusal(op, name, target)
        if refused:  # before the event: the record never holds what the replay would refuse
            raise (AttributeError if op in ("getattr", "setattr", "delattr") else TypeError)(refused)
        if all(map(_is_plain, args)) and all(map(_is_plain, kwargs.values())):  # what encode + decode would give
            enc_args = {"L": [{"L": list(args)}, {"D": [[k, v] for k, v in kwargs.items()]}]}
            g_args, g_kwargs = list(args), dict(kwargs)
        else:
            enc_args = self.encode([list(args), kwargs], "S", full_tensors=True)
            g_args, g_kwargs = self.decode(enc_args, "G")
        self._emit({"k": "O", "h": h, "op": op, "n": name, "a": enc_args})
        try:
            result = _apply(target, op, name, g_args, g_kwargs)
            how, result = crossing(op, target, g_args, result)
            encoded = self._enc_result(how, result)  # Refused when it holds what may not cross
        except (KeyboardInterrupt, Divergence, RecordLimit):
            raise
        except Exception as exc:  # noqa: BLE001 - the student sees the grader's exception
            self._emit({"k": "Ox", "e": exception_info(exc)})
            raise
        self._emit({"k": "Or", "v": encoded})
        _write_back(list(args) + list(kwargs.values()), list(g_args) + list(g_kwargs.values()))
        if how == "live":
            return self._g_proxy(self._register_g(result))
        mine = self.to_student(result, live_tensors=True)
        return iter(mine) if how == "snapshot" else mine

    def _enc_result(self, how, result):
        """A callback's result as the record holds it; Refused if it holds what may not cross."""
        if how == "live":
            return {"G": self._register_g(result)}
        self.vetting = True
        try:
            return self.encode(result, "G", full_tensors=False)
        finally:
            self.vetting = False

    # -- hooks the checks read (profiler hits, line counts, the reference refusal) ------------------
    def hook(self, kind: str, value):
        """RECORD: note `value` (plain data) in the log; REPLAY: return the recorded one."""
        if self.mode == "record":
            enc = self.encode(value, "S", full_tensors=True)
            self._emit({"k": "hook", "kind": kind, "v": enc})
            return self.decode(enc, "G")
        ev = self._next(("hook",), f"{kind} hook")
        if ev.get("kind") != kind:
            self._poison(f"event {self.pos - 1}: the check reads its {kind} hook, the record has {ev.get('kind')!r}")
        return self.decode(ev.get("v"), "G")


def _plain(x) -> bool:
    return x is None or type(x) in (bool, int, float, str)


def _write_back(originals, copies):
    """RECORD: what a grader's function wrote into the student's tensors / lists of plain values
    (a forward pass filling KV caches) goes back into the student's own objects."""
    for orig, copy in zip(originals, copies):
        if isinstance(orig, torch.Tensor) and isinstance(copy, torch.Tensor) and type(orig) in (torch.Tensor, torch.nn.Parameter):
            if orig.shape == copy.shape and not torch.equal(orig, copy.to(orig.dtype)):
                with torch.no_grad():
                    orig.copy_(copy)
        elif isinstance(orig, np.ndarray) and isinstance(copy, np.ndarray) and orig.shape == copy.shape:
            if not np.array_equal(orig, copy):
                orig[...] = copy
        elif type(orig) is list and type(copy) is list and all(_plain(x) for x in copy) and orig != copy:
            orig[:] = copy


def _same_shape(a, b) -> bool:
    """Equal except for float values (wall-clock times differ between two runs) and tensor contents."""
    if isinstance(a, float) or isinstance(b, float) or (isinstance(a, dict) and "f" in a):
        return isinstance(b, (float, int, dict)) or b is None
    if isinstance(a, dict) and isinstance(b, dict):
        if "tensor" in a:
            return b.get("tensor") == a["tensor"] and b.get("shape") == a["shape"]
        if set(a) != set(b):
            return False
        return all(_same_shape(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_shape(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------------------------------
# Exceptions as data
# ---------------------------------------------------------------------------------------------


def exception_info(exc: BaseException) -> dict:
    from ._checking import describe_exception

    bases = []
    for klass in type(exc).__mro__:
        spec = _course_class(klass)
        if spec:
            bases.append(spec)
        elif klass.__module__ == "builtins":
            bases.append(f"builtins:{klass.__name__}")
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student's __str__ may raise
        message = "<unprintable>"
    return {"type": type(exc).__name__, "bases": bases[:12], "msg": message[:4000],
            "where": describe_exception(exc)[:4000]}


_DYNAMIC: dict[tuple, type] = {}


def rebuild_exception(info) -> BaseException:
    """The student's exception as the grader's side sees it: a course_lib or builtin class, or a
    subclass named like the student's own class on the nearest course_lib / builtin base."""
    if not isinstance(info, dict):
        return Divergence("a malformed exception in the record")
    name, msg = str(info.get("type", "Exception"))[:100], str(info.get("msg", ""))[:4000]
    base = Exception
    for spec in info.get("bases", []) if isinstance(info.get("bases"), list) else []:
        if not isinstance(spec, str):
            continue
        if spec.startswith("builtins:"):
            cand = getattr(builtins, spec.split(":", 1)[1], None)
        else:
            try:
                cand = _load_course_class(spec)
            except Divergence:
                cand = None
        if isinstance(cand, type) and issubclass(cand, BaseException) and cand not in (KeyboardInterrupt,):
            base = cand
            break
    if base.__name__ == name:
        klass = base
    else:
        key = (name, base)
        if key not in _DYNAMIC:
            _DYNAMIC[key] = type(name, (base,), {"__module__": "student"})
        klass = _DYNAMIC[key]
    try:
        exc = klass.__new__(klass)
        BaseException.__init__(exc, msg)
    except Exception:  # noqa: BLE001
        exc = Exception(msg)
    try:
        exc._autograder_where = str(info.get("where", ""))
    except Exception:  # noqa: BLE001
        pass
    return exc
