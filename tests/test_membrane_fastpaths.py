"""The recording's fast paths (issue 23, throughput) decide exactly what the general code decides:
plain values inside containers, callback decisions kept per (operation, name, class), a tensor's
digest kept while the tensor is unchanged, an operation without arguments recorded without them, one
handle per bound method; and the garbage collector frozen only while a check call runs."""
from __future__ import annotations

import collections
import gc
import json

import torch

from autograder import callbacks
from autograder import record as R
from autograder.checks.nb00_setup import check_kv_bytes_per_token
from autograder.membrane import Membrane
from autograder.recording.active import activated
from autograder.replay import replay
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


def _kv_reading_the_config(config, bytes_per_elem):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem


def test_an_operation_without_arguments_is_recorded_without_them_and_replays_either_way(tmp_path):
    path = tmp_path / "record.jsonl"
    R.start(str(path))
    try:
        check_kv_bytes_per_token(_kv_reading_the_config, seed=0)
    finally:
        R.SESSION = None
    entry = json.loads(path.read_text().splitlines()[0])
    reads = [e for e in entry["events"] if e["k"] == "O" and e["op"] == "getattr"]
    assert reads and all("a" not in e for e in reads), reads[:2]
    assert not any("m" in e for e in entry["events"] if e["k"] == "Sr"), "no argument changed"
    assert replay(check_kv_bytes_per_token, entry) == (True, "")
    # The arguments spelled out (as a record written before, or by hand) mean the same; a null does not.
    spelled = json.loads(json.dumps(entry))
    for e in spelled["events"]:
        if e["k"] == "O" and "a" not in e:
            e["a"] = {"L": [{"L": []}, {"D": []}]}
    assert replay(check_kv_bytes_per_token, spelled) == (True, "")
    broken = json.loads(json.dumps(entry))
    next(e for e in broken["events"] if e["k"] == "O")["a"] = None
    ok, message = replay(check_kv_bytes_per_token, broken)
    assert not ok and "malformed arguments" in message, message


def test_a_bound_method_read_twice_is_one_handle():
    from course_lib.sim.clock import SimulatedClock

    m = Membrane("record")
    clock = m._g_proxy(m._register_g(SimulatedClock()))
    m.depth = 1  # (as inside a call of the student's code)
    first, again = clock.now, clock.now
    assert first is again and len(m.g_objs) == 2, m.g_objs
    assert first() == again() == 0.0
    other = m._g_proxy(m._register_g(SimulatedClock()))
    assert other.now is not first, "another object's method is another handle"


def test_the_collector_skips_older_objects_only_while_a_check_call_runs():
    assert gc.get_freeze_count() == 0
    m = Membrane("record")
    with activated(None):
        assert gc.get_freeze_count() == 0, "no membrane, no freeze"
    with activated(m):
        frozen = gc.get_freeze_count()
        assert frozen > 0
        # A check called inside a check: thawed only when the outer one ends. (Not `>= frozen`: a frozen
        # object whose last reference goes is freed and leaves the count, as CI once saw, 952,748 of 952,750.)
        with activated(m):
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    try:
        with activated(m):
            raise KeyError("a check that raises")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
    gc.freeze()  # frozen by the notebook itself: left frozen
    try:
        with activated(m):
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_course_lib_dataclass_the_student_built_is_rebuilt_by_its_constructor():
    """A student's SamplingParams crosses as its fields; the other side builds it with its constructor,
    whose `__post_init__` sets what derives from them (`needs_logprobs`, `adjusts_logits`: without them the
    grader's engine failed on a student-built one, a maintainer trial found). Fields the constructor
    refuses, as only a forged record holds, are a divergence, not an object built around its checks."""
    import pytest

    from autograder.recording.errors import Divergence

    m = Membrane("record")
    params = SamplingParams(max_tokens=3, logprobs=2, presence_penalty=0.5, stop_token_ids=[7])
    encoded = m.encode(params, "S", full_tensors=False)
    back = m.decode(encoded, "G")
    assert type(back) is SamplingParams and back == params
    assert back.needs_logprobs is True and back.adjusts_logits is True
    forged = dict(encoded, fields=dict(encoded["fields"], max_tokens=m.encode(-1, "S", False)))
    with pytest.raises(Divergence, match="cannot be built: max_tokens must be an integer >= 1"):
        m.decode(forged, "G")
