"""The recording's fast paths (issue 23, throughput) decide exactly what the general code decides:
plain values inside containers, callback decisions kept per (operation, name, class), a tensor's
digest kept while the tensor is unchanged."""
from __future__ import annotations

import collections

import torch

from autograder import callbacks
from autograder.membrane import Membrane
from course_lib import SamplingParams
from course_lib.kv.manager import KVCacheManager
from course_lib.scheduler.request import Request

EDGES = [0, -1, 2 ** 53 - 1, 2 ** 53, -(2 ** 53), 2 ** 70, 1.5, float("nan"), float("inf"), -0.0, True, False,
         None, "", "text", b"raw", (1, "a"), [], {"k": [1, 2]}]


def test_containers_of_edge_values_encode_as_each_value_alone():
    m = Membrane("record")
    for owner in ("G", "S"):
        got = m.encode(list(EDGES), owner, full_tensors=False)["L"]
        assert got == [m.encode(v, owner, full_tensors=False) for v in EDGES]
        assert m.encode(2 ** 53, owner, False) == {"i": str(2 ** 53)} and m.encode(float("nan"), owner, False) == {"f": "nan"}
        back = m.decode(m.encode(tuple(EDGES), owner, False), "G")
        assert type(back) is tuple and back[:7] == tuple(EDGES[:7]) and back[8:] == tuple(EDGES[8:])


def test_a_decision_is_the_same_from_the_cache_as_worked_out():
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=2))
    targets = [("getattr", "num_tokens", request), ("getattr", "__class__", request), ("setattr", "status", request),
               ("call", None, request.append_output_token if hasattr(request, "append_output_token") else len),
               ("call", None, [].append), ("call", None, collections.deque().popleft), ("call", None, print),
               ("call", None, KVCacheManager.__init__), ("len", None, [1])]
    callbacks._DECISIONS.clear()
    first = [callbacks.op_refusal(op, name, t) for op, name, t in targets]
    again = [callbacks.op_refusal(op, name, t) for op, name, t in targets]
    assert first == again == [callbacks._op_refusal(op, name, t) for op, name, t in targets]
    assert first[1] is not None and first[6] is not None, "refused stays refused"
    assert len(callbacks._DECISIONS) >= 5


def test_a_tensor_changed_in_place_gets_a_new_digest_and_an_inference_tensor_is_never_kept():
    m = Membrane("record")
    weight = torch.ones(4, 4)
    before = m.encode(weight, "G", full_tensors=False)
    assert m.encode(weight, "G", full_tensors=False) == before
    weight.add_(1)
    after = m.encode(weight, "G", full_tensors=False)
    assert after["sha"] != before["sha"]
    with torch.inference_mode():
        frozen = torch.zeros(3)
    m.encode(frozen, "G", full_tensors=False)
    assert id(frozen) not in m.digests


def test_what_a_decision_depends_on_is_in_its_key():
    class Base:
        def run(self):
            return 1

    class Child(Base):
        pass

    key = callbacks._decision_key
    assert key("call", None, Base().run) != key("call", None, Child().run), "a method's owner class is in the key"
    assert key("getattr", "x", Base()) != key("getattr", "x", Child()) != key("getattr", "y", Child())
    assert key("call", None, Base) is None, "a class itself is decided each time"
