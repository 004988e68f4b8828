"""The membrane when the student's piece runs inside the engine and shares its state: a grader
object the student's side changes (a request's counter, its output list, a kv manager's tables)
is changed for real, in the sandbox and again in the grader's replay, so that a correct scheduler
passes on replay, a wrong one fails, and a record that skips or forges a change does not pass.

Each exercise's generated reference and one hand-written mutant are recorded in this process (as
a submission would be in the sandbox: loaded from a copy outside the autograder, so the reference
refusal does not see them as the autograder's) and replayed against the grader's own check."""
from __future__ import annotations

import json

import pytest
from check_support import student_copy_fixture

from autograder import record
from autograder.checks import get_check
from autograder.membrane import Membrane
from autograder.replay import read_records, replay


# exercise -> (notebook module, a mutant that breaks it)
CASES = {
    "StudentScheduler": ("nb02_continuous_batching", "LeaksPages"),
    "StudentRecompute": ("nb07_admission_control", "KeepsProgress"),
    "StudentPrefixCache": ("nb06_prefix_caching", "EvictDoesNothing"),
    "StudentBlockPool": ("nb03_paged_kv", "RefcountNotDecremented"),
    "build_flat_batch": ("nb03_paged_kv", "flat_positions_off_by_one"),
    "StudentWatermark": ("nb07_admission_control", "StrictlyAbove"),
}


student_copy = student_copy_fixture("submitted")


@pytest.fixture(scope="module")
def recorded(student_copy, tmp_path_factory):
    """`recorded(kind, exercise)`: (the record entry of one check call, passed in the kernel), recorded
    as the sandbox records it; each is recorded once per module."""
    folder, cache = tmp_path_factory.mktemp("records"), {}

    def run(kind, exercise):
        if (kind, exercise) not in cache:
            module, mutant = CASES[exercise]
            impl = getattr(student_copy(kind, module), exercise if kind == "reference" else mutant)
            path = folder / f"{kind}_{exercise}.jsonl"
            record.start(str(path))
            try:
                get_check(exercise)(impl, seed=0)
                passed = True
            except AssertionError:
                passed = False
            finally:
                record.SESSION = None
            entries, problems = read_records(path)
            assert not problems and len(entries) == 1, problems
            cache[kind, exercise] = entries[0], passed
        return cache[kind, exercise]

    return run


@pytest.fixture(scope="module")
def scheduler_record(recorded):
    return recorded("reference", "StudentScheduler")[0]


@pytest.mark.parametrize("exercise", sorted(CASES))
def test_the_reference_passes_on_replay(exercise, recorded):
    entry, passed = recorded("reference", exercise)
    assert passed, entry["outcome"]
    assert replay(get_check(exercise), entry) == (True, "")


@pytest.mark.parametrize("exercise", sorted(CASES))
def test_a_mutant_fails_on_replay(exercise, recorded):
    entry, passed = recorded("mutants", exercise)
    ok, message = replay(get_check(exercise), entry)
    assert not passed and not ok, (passed, message)
    assert "does not answer" not in message, f"the mutant should fail the check itself, not diverge: {message}"


def test_a_truncated_record_diverges(scheduler_record):
    events = scheduler_record["events"]
    ok, message = replay(get_check("StudentScheduler"), dict(scheduler_record, events=events[: len(events) // 2]))
    assert not ok and "the record ends before" in message, message


def test_a_record_that_skips_a_token_append_does_not_pass(scheduler_record):
    """The student's side appends each sampled token to the grader's own list (an O event re-done in
    replay): a record without one cannot make the grader's request any longer."""
    events = scheduler_record["events"]
    append = next(i for i, e in enumerate(events) if e.get("k") == "O" and e.get("n") == "append")
    call = next(i for i in range(append + 2, len(events)) if events[i].get("k") == "O")
    assert events[call]["op"] == "call"
    forged = events[:append] + events[call + 2:]  # getattr append, its answer, the call, its answer
    ok, message = replay(get_check("StudentScheduler"), dict(scheduler_record, events=forged))
    assert not ok and message, message


def test_a_forged_progress_counter_does_not_pass(scheduler_record):
    """The record sets num_computed_tokens: a record claiming more progress than the step made fails."""
    events = json.loads(json.dumps(scheduler_record["events"]))
    i = next(i for i, e in enumerate(events) if e.get("k") == "O" and e.get("op") == "setattr"
             and e.get("n") == "num_computed_tokens" and e["a"]["L"][0]["L"][0] > 0)
    events[i]["a"]["L"][0]["L"][0] += 1
    ok, message = replay(get_check("StudentScheduler"), dict(scheduler_record, events=events))
    assert not ok and message, message


# -- the mechanism, on a toy grader object ---------------------------------------------------


class _Table:
    def __init__(self):
        self.items = [1, 2]
        self.index = {"a": [0]}


def _student(table):
    table.items.append(3)  # a list reached through an attribute: the grader's own
    table.index.setdefault("b", []).append(7)  # a container's own method hands out what it holds
    table.index["a"].append(5)
    return sum(table.items) + sum(x for x in table.items)


def test_changes_to_a_grader_objects_containers_reach_it_in_both_runs():
    m = Membrane("record")
    mine = _Table()
    assert m.root(_student)(mine) == 12
    assert mine.items == [1, 2, 3] and mine.index == {"a": [0, 5], "b": [7]}

    again = _Table()
    stub = Membrane("replay", events=json.loads(json.dumps(m.events))).root(info={"c": True})
    assert stub(again) == 12
    assert again.items == [1, 2, 3] and again.index == {"a": [0, 5], "b": [7]}


def test_iterating_a_grader_list_is_one_crossing():
    table = _Table()
    table.items = list(range(1000))
    m = Membrane("record")
    assert m.root(lambda t: sum(x for x in t.items))(table) == sum(range(1000))
    assert len(m.events) < 10, [e["k"] for e in m.events]
