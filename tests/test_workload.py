"""Workloads are deterministic, have the advertised statistics, and closed loops stay closed."""
import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.sim.workload import (
    DEFAULT_OUTPUT_DIST,
    DEFAULT_PROMPT_DIST,
    ClosedLoopUsers,
    LengthDist,
    RequestSpec,
    load_trace,
    make_prompt_tokens,
    open_loop,
    save_trace,
)


def test_open_loop_is_deterministic_for_a_seed():
    a = open_loop(50, rate=4.0, seed=7)
    b = open_loop(50, rate=4.0, seed=7)
    c = open_loop(50, rate=4.0, seed=8)
    assert a == b
    assert a != c
    assert [s.request_id for s in a] == [f"r{i}" for i in range(50)]


def test_changing_the_rate_keeps_the_request_lengths():
    slow, fast = open_loop(30, rate=1.0, seed=3), open_loop(30, rate=10.0, seed=3)
    assert [(s.prompt_len, s.output_len) for s in slow] == [(s.prompt_len, s.output_len) for s in fast]
    assert slow[-1].arrival_time > fast[-1].arrival_time


def test_poisson_mean_gap_is_one_over_rate():
    specs = open_loop(20_000, rate=5.0, seed=0)
    gaps = np.diff([0.0] + [s.arrival_time for s in specs])
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    assert all(g >= 0 for g in gaps)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation(shape):
    specs = open_loop(20_000, rate=2.0, seed=1, burstiness=shape)
    gaps = np.diff([0.0] + [s.arrival_time for s in specs])
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.06)


def test_infinite_rate_means_everything_at_once():
    assert {s.arrival_time for s in open_loop(5, rate=float("inf"))} == {0.0}


def test_bad_rate_is_a_value_error():
    with pytest.raises(ValueError, match="rate"):
        open_loop(3, rate=0.0)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert LengthDist.fixed(12).sample(rng, 4).tolist() == [12] * 4
    u = LengthDist.uniform(3, 5).sample(rng, 2000)
    assert set(u.tolist()) == {3, 4, 5}  # both ends included
    prompts = DEFAULT_PROMPT_DIST.sample(rng, 100_000)
    assert np.median(prompts) == pytest.approx(64, rel=0.05)
    assert np.percentile(prompts, 99) == pytest.approx(400, rel=0.08)
    assert prompts.min() >= DEFAULT_PROMPT_DIST.lo and prompts.max() <= DEFAULT_PROMPT_DIST.hi
    outputs = DEFAULT_OUTPUT_DIST.sample(rng, 100_000)
    assert np.median(outputs) == pytest.approx(128, rel=0.05)
    assert outputs.mean() == pytest.approx(200, rel=0.05)  # the chapter's average response
    assert outputs.max() <= 1024 and outputs.min() >= 1
    assert outputs.dtype == np.int64
    with pytest.raises(ValueError):
        LengthDist.uniform(5, 3)


def test_shared_prefix_is_part_of_the_prompt():
    specs = open_loop(20, rate=1.0, seed=2, shared_prefix=32, prompt_dist=LengthDist.fixed(10))
    assert all(s.prompt_len == 42 and s.shared_prefix_len == 32 for s in specs)


def _drive_closed_loop(users: ClosedLoopUsers, service_time) -> tuple[list[RequestSpec], int]:
    """A toy server with unlimited capacity: each request takes service_time(spec) seconds."""
    in_flight, issued, max_outstanding = [], [], 0
    for spec in users.initial():
        heapq.heappush(in_flight, (spec.arrival_time + service_time(spec), spec.request_id, spec))
        issued.append(spec)
    while in_flight:
        max_outstanding = max(max_outstanding, users.num_outstanding)
        finish, _, spec = heapq.heappop(in_flight)
        nxt = users.on_finish(spec, finish)
        if nxt is not None:
            assert nxt.user == spec.user and nxt.arrival_time >= finish
            heapq.heappush(in_flight, (nxt.arrival_time + service_time(nxt), nxt.request_id, nxt))
            issued.append(nxt)
    return issued, max_outstanding


def test_closed_loop_issues_exactly_num_requests():
    users = ClosedLoopUsers(num_users=4, num_requests=23, seed=5)
    issued, max_outstanding = _drive_closed_loop(users, lambda s: 0.01 * s.output_len)
    assert len(issued) == 23 and users.done
    assert [s.request_id for s in sorted(issued, key=lambda s: int(s.request_id[1:]))] == [f"r{i}" for i in range(23)]
    assert max_outstanding <= 4
    with pytest.raises(ValueError, match="not outstanding"):
        users.on_finish(issued[0], 99.0)


def test_closed_loop_zero_think_time_reissues_at_the_finish():
    users = ClosedLoopUsers(num_users=2, num_requests=6, seed=0, think_time=0.0)
    first = users.initial()
    assert [s.arrival_time for s in first] == [0.0, 0.0] and [s.user for s in first] == [0, 1]
    nxt = users.on_finish(first[1], 3.25)
    assert nxt.arrival_time == 3.25 and nxt.user == 1 and nxt.request_id == "r2"


def test_closed_loop_is_deterministic_and_thinks():
    def run():
        users = ClosedLoopUsers(num_users=3, num_requests=12, seed=9, think_time=0.5, shared_prefix=8)
        return _drive_closed_loop(users, lambda s: 0.002 * s.output_len)[0]

    a, b = run(), run()
    assert a == b
    assert all(s.shared_prefix_len == 8 and s.prompt_len > 8 for s in a)
    assert any(s.arrival_time > 0 for s in a[3:])


def test_fewer_requests_than_users():
    users = ClosedLoopUsers(num_users=5, num_requests=2)
    assert len(users.initial()) == 2


@settings(max_examples=40, deadline=None)
@given(
    num_users=st.integers(1, 6),
    num_requests=st.integers(0, 25),
    finish_order=st.randoms(use_true_random=False),
)
def test_closed_loop_never_exceeds_its_users(num_users, num_requests, finish_order):
    users = ClosedLoopUsers(num_users, num_requests, seed=1, think_time=0.1)
    outstanding, t = list(users.initial()), 0.0
    issued = len(outstanding)
    while outstanding:
        assert len(outstanding) <= num_users
        spec = outstanding.pop(finish_order.randrange(len(outstanding)))
        t += 1.0
        nxt = users.on_finish(spec, t)
        if nxt is not None:
            outstanding.append(nxt)
            issued += 1
    assert issued == num_requests == users.num_issued
    assert users.done


def test_trace_round_trip(tmp_path):
    specs = open_loop(10, rate=3.0, seed=4, shared_prefix=5)
    specs.append(RequestSpec("offline", 7, 3, None, None))
    path = tmp_path / "trace.jsonl"
    save_trace(specs, path)
    assert load_trace(path) == specs
    assert len(path.read_text().splitlines()) == 11


def test_bad_trace_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"request_id": "r0", "prompt_len": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trace(path)


def test_prompt_tokens_share_the_prefix_and_avoid_special_ids():
    a, b = RequestSpec("r0", 40, 5, 0.0, None, 16), RequestSpec("r1", 30, 5, 0.0, None, 16)
    ta, tb = make_prompt_tokens(a, vocab_size=50, seed=3), make_prompt_tokens(b, vocab_size=50, seed=3)
    assert len(ta) == 40 and len(tb) == 30
    assert ta[:16] == tb[:16]
    assert ta[16:26] != tb[16:26]
    assert not {0, 1, 2} & set(ta + tb)
    assert all(0 <= t < 50 for t in ta + tb)
    assert make_prompt_tokens(a, vocab_size=50, seed=3) == ta  # deterministic
    assert make_prompt_tokens(a, vocab_size=50, seed=4)[:16] != ta[:16]
    with pytest.raises(ValueError, match="vocab_size"):
        make_prompt_tokens(a, vocab_size=3)
