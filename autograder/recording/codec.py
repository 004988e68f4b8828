"""The codec: what crosses the boundary, as JSON-able data.

Data (None, bool, int, float, str, bytes, tuples, lists, dicts, sets, tensors, numpy arrays, course_lib
enums and course_lib dataclasses) crosses as a copy; any other object as its owner's handle (`proxy`).
A tensor crosses as raw little-endian bytes (base64) with dtype and shape, or as a digest of them where
only its identity matters; nothing read from a record is ever unpickled.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import math

import numpy as np
import torch

from .class_names import course_class as _course_class, load_course_class as _load_course_class
from .errors import Divergence, RecordLimit, Refused
from .proxy import _H, _M, _SIDE, CallableProxy, Handles, Proxy, g_key

MAX_TENSOR_BYTES = 64 << 20
MAX_DIGESTS = 4096  # tensors whose digest one check call keeps (a model's weights are a few dozen)

_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
_NP_DTYPES = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
              "uint64", "bool", "complex64", "complex128"}


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


_TAGS = {"S", "G", "i", "f", "T", "L", "D", "Set", "FSet", "B", "tensor", "nd", "np", "dtype", "device", "slice",
         "range", "E", "DC"}


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


class Codec(Handles):
    """Encoding and decoding for one membrane: its unknown objects become its handles."""

    def __init__(self, exercise: str | None = None, fail=None):
        super().__init__(exercise, fail)
        self.vetting = False  # encoding a callback's result: what may not cross is refused
        # id -> (tensor, version, pointer, digest): a model's weights cross at every forward pass the
        # student's engine makes (their digest was a quarter of recording nb00's check); an unchanged
        # tensor (same version counter, same storage) keeps its digest. The record and the replay
        # both use it, so they agree; the verdict never reads a digest, only the check's values.
        self.digests: dict[int, tuple] = {}

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
            if self.vetting and g_key(v) not in self.g_ids:
                from ..callbacks import hold_refusal

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
            fields = {f.name: f for f in dataclasses.fields(cls)}
            given = {}
            for k, x in e["fields"].items():
                if k not in fields:
                    raise Divergence(f"the record gives {e['DC']} an unknown field {k!r}")
                given[k] = d(x)
            # Built by its constructor, as the student's side built it: a `__post_init__` checks the fields and
            # sets what derives from them (SamplingParams' `needs_logprobs`), which the fields alone do not carry.
            try:
                obj = cls(**{k: v for k, v in given.items() if fields[k].init})
            except (TypeError, ValueError) as err:
                raise Divergence(f"the record's {e['DC']} cannot be built: {str(err)[:200]}") from None
            for k, v in given.items():
                if not fields[k].init:
                    object.__setattr__(obj, k, v)
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
