"""Proxies: a student object as the grader's side sees it (an S-handle) and a grader object as the
student's side sees it (a G-handle), each numbered in order of appearance; every use of a proxy is
one operation of its membrane."""
from __future__ import annotations

import types

from .class_names import class_name, load_shown_class, shown_class

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


def g_key(obj):
    """What a grader object's handle is kept under: its id; for a bound method, its object's and its
    function's ids (every read of `clock.now` makes a new bound method: a student's loop reading it at
    each step gets one handle, not thousands, each vetted and kept). The first method object stays in
    the table, which keeps both alive, so neither id can be reused while the key is in use."""
    if type(obj) is types.MethodType:
        return (id(obj.__self__), id(obj.__func__))
    return id(obj)


def _refuse_plainly(message: str):
    raise AssertionError(message)


class Handles:
    """A membrane's two tables of handles (S: the student's objects, G: the grader's) and their proxies.

    `fail` fails the check call in progress (the checks hand in `autograder._checking.fail`, which a
    student's `except` cannot swallow); a membrane used outside a check raises a plain AssertionError."""

    def __init__(self, exercise: str | None = None, fail=None):
        self.exercise = exercise  # the check's adapter name, for the messages
        self.fail = fail or _refuse_plainly
        self.g_objs: list = []  # G-handle -> the grader's real object
        self.g_ids: dict[int, int] = {}
        self.g_proxies: dict[int, Proxy] = {}
        self.s_objs: list = []  # S-handle -> the student's real object (record mode)
        self.s_info: dict[int, dict] = {}  # S-handle -> {"c": callable, "t": is a class}
        self.s_ids: dict[int, int] = {}
        self.s_proxies: dict[int, Proxy] = {}

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
        self.s_info[h] = {"c": callable(obj), "t": isinstance(obj, type), "n": class_name(type(obj))}
        shown = shown_class(obj)
        if shown:
            self.s_info[h]["k"] = shown
        return h

    def _register_g(self, obj) -> int:
        key = g_key(obj)
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
            klass = load_shown_class(info["k"])
            if klass is not None:
                return klass
        return CallableProxy if self.s_info.get(h, {}).get("c") else Proxy

    def refuse_comparison(self, h):
        check = f"check_{self.exercise}" if self.exercise else "the check"
        self.fail(f"{check} compares what your code returned: return plain values (int, float, str, list, tuple, "
                  f"dict, tensor), not an object of class {self.s_info.get(h, {}).get('n') or '?'}")

    def identity_eq(self, proxy) -> bool:
        side, h = object.__getattribute__(proxy, _SIDE), object.__getattribute__(proxy, _H)
        if side == "S":
            return True
        return type(self.g_objs[h]).__eq__ is object.__eq__
