"""The event machine: a check call's crossings of the boundary, written as events (RECORD, in the
sandbox) or answered from them (REPLAY, in the grader's own process). See `autograder.recording`."""
from __future__ import annotations

import threading

import numpy as np
import torch

from .codec import Codec, _is_plain, digest
from .errors import MAX_EVENTS, Divergence, RecordLimit
from .exceptions_as_data import describe_plainly, exception_info, rebuild_exception
from .operations import BINARY as _BINARY, UNARY as _UNARY, apply as _apply, callback_refusal, crossing


# What a callback event may ask of a grader object (anything else in a record is forged).
_CALLBACK_OPS = frozenset(("call", "getattr", "setattr", "delattr", "setitem", "exit", "rop")) | set(_BINARY) | set(_UNARY)


class Membrane(Codec):
    """One check call's boundary. `fail` and `describe_exception` come from the checks
    (`autograder._checking.fail` / `describe_exception`, handed in by `autograder.record` and
    `autograder.replay`): without them a refused comparison is a plain AssertionError and a student's
    exception is described by its type and message."""

    def __init__(self, mode: str, events: list | None = None, exercise: str | None = None, *, fail=None,
                 describe_exception=None):
        if mode not in ("record", "replay"):
            raise ValueError(f"mode must be record or replay, got {mode!r}")
        super().__init__(exercise, fail)
        self.mode = mode
        self.describe_exception = describe_exception or describe_plainly
        self.events: list = [] if events is None else events
        self.pos = 0
        self.poisoned: str | None = None
        self.depth = 0  # S-operations in progress (student code may only call back inside one)
        self.thread = threading.get_ident()

    # -- the event log -----------------------------------------------------------------------------
    def _emit(self, event):
        events = self.events
        if len(events) >= MAX_EVENTS:
            raise RecordLimit(f"more than {MAX_EVENTS} crossings in one check call")
        events.append(event)

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

    def _what(self, op, name):
        return f"{op} {name}" if name else op

    # -- the grader asks the student ---------------------------------------------------------------
    def _s_op(self, h, op, name, args, kwargs):
        if threading.get_ident() != self.thread:
            raise RuntimeError("the student's objects are used from a thread the grader did not start")
        # A question without arguments carries no digest ("a"): most are (an attribute, len, next).
        question = {"k": "S", "h": h, "op": op, "n": name}
        if args or kwargs:
            question["a"] = digest(self.encode([list(args), kwargs], "G", full_tensors=False))
        if self.mode == "replay":
            ev = self._next(("S",), f"question #{h}.{self._what(op, name)}")
            if (ev.get("h"), ev.get("op"), ev.get("n")) != (h, op, name):
                self._poison(f"event {self.pos - 1}: the check asks {self._what(op, name)} of student object #{h}, "
                             f"the record answers {ev.get('op')} {ev.get('n') or ''} of #{ev.get('h')}")
            if ev.get("a") != question.get("a"):
                self._poison(f"event {self.pos - 1}: the check asks {self._what(op, name)} with other arguments "
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
            info = exception_info(exc, self.describe_exception)
            mutations = self._mutations(args, kwargs, s_args, s_kwargs)
            self._emit({"k": "Sx", "e": info, "m": mutations} if mutations else {"k": "Sx", "e": info})
            self._apply_mutations(args, kwargs, mutations)
            raise rebuild_exception(info) from None
        finally:
            self.depth -= 1
        enc = self.encode(result, "S", full_tensors=True)
        mutations = self._mutations(args, kwargs, s_args, s_kwargs)
        # ("m" only when an argument changed: an event of plain values is no work for the collector)
        self._emit({"k": "Sr", "v": enc, "m": mutations} if mutations else {"k": "Sr", "v": enc})
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
        if "a" not in ev:  # the recorder leaves "a" out of a call without arguments
            args, kwargs = [], {}
        else:
            a = ev["a"]
            if not (isinstance(a, dict) and "L" in a and len(a["L"]) == 2):
                self._poison(f"event {self.pos - 1}: malformed arguments in the record")
            args, kwargs = self.decode(a, "G")
            if not (isinstance(args, list) and isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
                self._poison(f"event {self.pos - 1}: malformed arguments in the record")
        if op not in _CALLBACK_OPS:
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
        if not args and not kwargs:  # most callbacks (an attribute, len, iter): the event carries no "a"
            event, g_args, g_kwargs = {"k": "O", "h": h, "op": op, "n": name}, [], {}
        elif all(map(_is_plain, args)) and all(map(_is_plain, kwargs.values())):  # what encode + decode would give
            event = {"k": "O", "h": h, "op": op, "n": name,
                     "a": {"L": [{"L": list(args)}, {"D": [[k, v] for k, v in kwargs.items()]}]}}
            g_args, g_kwargs = list(args), dict(kwargs)
        else:
            enc_args = self.encode([list(args), kwargs], "S", full_tensors=True)
            event = {"k": "O", "h": h, "op": op, "n": name, "a": enc_args}
            g_args, g_kwargs = self.decode(enc_args, "G")
        self._emit(event)
        try:
            result = _apply(target, op, name, g_args, g_kwargs)
            how, result = crossing(op, target, g_args, result)
            encoded = self._enc_result(how, result)  # Refused when it holds what may not cross
        except (KeyboardInterrupt, Divergence, RecordLimit):
            raise
        except Exception as exc:  # noqa: BLE001 - the student sees the grader's exception
            self._emit({"k": "Ox", "e": exception_info(exc, self.describe_exception)})
            raise
        self._emit({"k": "Or", "v": encoded})
        if g_args or g_kwargs:
            _write_back(list(args) + list(kwargs.values()), list(g_args) + list(g_kwargs.values()))
        if how == "live":
            return self._g_proxy(self._register_g(result))
        mine = self.to_student(result, live_tensors=True)
        return iter(mine) if how == "snapshot" else mine

    def _enc_result(self, how, result):
        """A callback's result as the record holds it; Refused if it holds what may not cross."""
        if how == "live":
            return {"G": self._register_g(result)}
        if _is_plain(result):  # (most answers: an int, a str, None; encoded as themselves)
            return result
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
    kind = type(a)
    if kind is type(b) and (kind is int or kind is str or kind is bool or a is None):  # (most answers)
        return a == b
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
