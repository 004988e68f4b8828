"""A record is data, never instructions: forged records against the grader's replay (no kernel).

The sandbox writes /out/record.jsonl, and so can the student's code: each test forges a record
the way a student would (usually by recording a malicious student in this process, as the
sandbox would, then editing or amplifying the record) and hands it to the grader's replay. Each
attack must end in a zero for its check with a reason, never in a grader error, a file written,
a module imported or the grader's time and memory spent; an honest record still replays.

Run against the code before this change (the module from git, copied to /tmp), the same forged
records wrote the file (config.save), imported the module, crashed the reading with
RecursionError, passed (the oversized line, too many events) and ran unbounded (the CPU burner):
docs/grading.md, "How the verdict is decided", lists what a forged record can still do.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from autograder import record as R
from autograder import replay as replay_module
from autograder.checks.nb00_setup import check_kv_bytes_per_token
from autograder.replay import MAX_DEPTH, MAX_EVENTS, MAX_LINE_BYTES, load_record, parse_record, replay
from autograder.replay_process import isolation, landlock_abi, run_isolated
from autograder.verdict import Planned, replay_plan

KV = "kv_bytes_per_token"
PLAN = {"kv_tests": [Planned(KV, 0, False), Planned(KV, 1, True)]}


def kv_reading_the_config(config, bytes_per_elem):
    """An honest student: every read of the grader's config is a callback event."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_elem


def recorded(tmp_path, impl, check=check_kv_bytes_per_token, seeds=(0, 1), name="record.jsonl"):
    """The record lines of `check(impl)` on `seeds`, recorded as the sandbox records them."""
    path = tmp_path / name
    R.start(str(path))
    try:
        for seed in seeds:
            try:
                check(impl, seed=seed)
            except AssertionError:
                pass
    finally:
        R.SESSION = None
    return [json.loads(line) for line in path.read_text().splitlines()]


def raw(entries) -> bytes:
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)


def first_callback_end(events) -> int:
    """Index just after the first callback's answer (where more callbacks of the student's code fit)."""
    i = next(i for i, e in enumerate(events) if e.get("k") == "O")
    return next(j for j in range(i + 1, len(events)) if events[j].get("k") in ("Or", "Ox")) + 1


def amplified(entry, repeat: int, times: int):
    """The entry with its last `repeat` callback events (before the student's answer) repeated `times` times."""
    events = entry["events"]
    start = first_callback_end(events)
    answer = next(i for i in range(start, len(events)) if events[i].get("k") in ("Sr", "Sx"))
    block = events[answer - repeat:answer]
    return dict(entry, events=events[:answer] + block * times + events[answer:])


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    return recorded(tmp_path_factory.mktemp("honest"), kv_reading_the_config)


# -- the honest record -------------------------------------------------------------------------


def test_an_honest_record_replays_in_process_and_in_the_replay_process(honest):
    assert all(replay(check_kv_bytes_per_token, e) == (True, "") for e in honest)
    verdict = replay_plan(PLAN, raw(honest), budget_s=60)
    assert verdict.results == {(KV, 0): (True, ""), (KV, 1): (True, "")}, verdict
    assert not verdict.problems and not verdict.flags
    assert {(e["exercise"], e["seed"]) for e in verdict.entries} == {(KV, 0), (KV, 1)}
    assert verdict.isolation in (f"Landlock ABI {landlock_abi()}", "uid 65534", "no Landlock (the grader's own uid)")


# -- callbacks: only the engine's own code, never I/O, never an import -------------------------


def test_a_forged_config_save_is_refused_and_writes_no_file(honest, tmp_path):
    """The red team's attack: getattr save on the grader's ModelConfig, then call it with a path."""
    planted = tmp_path / "planted.json"
    entry = honest[0]
    events = entry["events"]
    at = first_callback_end(events)
    config = events[at - 2]["h"]
    no_args = {"L": [{"L": []}, {"D": []}]}
    evil = [{"k": "O", "h": config, "op": "getattr", "n": "save", "a": no_args}, {"k": "Or", "v": {"G": config + 1}},
            {"k": "O", "h": config + 1, "op": "call", "n": None, "a": {"L": [{"L": [str(planted)]}, {"D": []}]}},
            {"k": "Or", "v": None}]
    forged = dict(entry, events=events[:at] + evil + events[at:])
    ok, message = replay(check_kv_bytes_per_token, forged)
    assert not ok and "does not run ModelConfig.save" in message and "Path from pathlib" in message, message
    verdict = replay_plan({"c": [Planned(KV, 0, False)]}, raw([forged]), budget_s=60)
    assert verdict.results[(KV, 0)][0] is False and "ModelConfig.save" in verdict.results[(KV, 0)][1]
    assert not planted.exists()


def test_the_student_side_gets_the_same_refusal_when_recording(tmp_path):
    """The rule holds when the record is written too: the recorder never writes what replay refuses."""
    def saves_the_config(config, bytes_per_elem):
        config.save(str(tmp_path / "from_the_kernel.json"))

    [entry] = recorded(tmp_path, saves_the_config, seeds=(0,))
    assert "does not run ModelConfig.save" in entry["outcome"]["msg"], entry["outcome"]
    assert not (tmp_path / "from_the_kernel.json").exists()
    assert not any(e.get("n") == "save" for e in entry["events"])


@pytest.mark.parametrize("where", ["answer", "exception", "shown class"])
def test_a_class_named_by_the_record_is_never_imported(honest, where):
    module = "course_lib.loadgen.report"  # not an engine package: the replay never imports it itself
    before = sys.modules.pop(module, None)
    try:
        entry = honest[0]
        events = json.loads(json.dumps(entry["events"]))
        answer = next(i for i, e in enumerate(events) if e.get("k") == "Sr")
        spec = f"{module}:Report"
        if where == "answer":
            events[answer]["v"] = {"DC": spec, "fields": {}}
        elif where == "exception":
            events[answer] = {"k": "Sx", "e": {"type": "Report", "bases": [spec], "msg": "", "where": ""}, "m": []}
        else:
            events[answer]["v"] = {"S": 7, "c": False, "t": False, "k": spec}
        ok, message = replay(check_kv_bytes_per_token, dict(entry, events=events))
        assert not ok, message
        assert module not in sys.modules, "the record made the grader import a module"
    finally:
        if before is not None:
            sys.modules[module] = before


# -- limits, checked before anything is parsed ---------------------------------------------------


def test_a_deeply_nested_record_is_a_zero_for_its_check_only(honest):
    deep = 100_000
    line = json.dumps(honest[1], separators=(",", ":"))
    nested = line.replace('"k":"Sr","v":', '"k":"Sr","v":' + '{"L":[' * deep + "1" + "]}" * deep + ',"x":', 1)
    record = raw(honest[:1]) + nested.encode() + b"\n"
    parsed = parse_record(record)
    assert parsed.refused == {(KV, 1): f"the record of check_{KV}(seed=1) is nested deeper than {MAX_DEPTH} levels "
                                        "(the recorder never writes that)"}
    verdict = replay_plan(PLAN, record, budget_s=60)
    assert verdict.results[(KV, 0)] == (True, "")
    assert verdict.results[(KV, 1)] == (False, parsed.refused[(KV, 1)])


def test_a_line_over_the_size_limit_is_refused_unparsed(honest):
    padded = dict(honest[1], pad="x" * (MAX_LINE_BYTES + 10))
    parsed = parse_record(raw(honest[:1] + [padded]))
    assert "over the 40 MB limit of one check call" in parsed.refused[(KV, 1)], parsed.refused
    assert [(e["exercise"], e["seed"]) for e in parsed.entries] == [(KV, 0)]


def test_a_line_with_too_many_events_is_refused(honest):
    filler = [{"k": "hook", "kind": "x", "v": None}] * (MAX_EVENTS + 1)
    parsed = parse_record(raw([dict(honest[1], events=honest[1]["events"] + filler)]))
    assert f"over the limit of {MAX_EVENTS}" in parsed.refused[(KV, 1)], parsed.refused


def test_a_record_larger_than_the_limit_is_cut_at_a_line_end(honest, tmp_path, monkeypatch):
    path = tmp_path / "record.jsonl"
    path.write_bytes(raw(honest) * 3)
    monkeypatch.setattr(replay_module, "MAX_RECORD_BYTES", len(raw(honest)) + 100)
    data, problems = load_record(path)
    assert data == raw(honest) and "the check calls after its first" in problems[0], problems


def test_a_record_stripped_of_the_recorders_evidence_is_flagged(honest):
    stripped = {k: v for k, v in honest[1].items() if k not in ("code", "thread_reference_calls")}
    verdict = replay_plan(PLAN, raw([honest[0], stripped]), budget_s=60)
    assert verdict.flags == [f"check_{KV}(seed=1): the record was edited (its line lacks the 'code', "
                             "'thread_reference_calls' the recorder always writes)"], verdict.flags
    assert not parse_record(raw(honest)).flags


# -- the replay's own process: a budget, no writes, nothing of the grader's ---------------------


def burns_cpu(config, bytes_per_elem):
    """Recorded once with 2 counts; the forged record repeats the count 150,000 times."""
    pages = config.eos_token_ids  # a list of the grader's
    pages.extend([0] * 300_000)
    count = pages.count
    for _ in range(2):
        count(1)
    return 0


def test_a_record_that_burns_cpu_is_stopped_at_the_budget(honest, tmp_path):
    [burner] = recorded(tmp_path, burns_cpu, seeds=(1,), name="burner.jsonl")
    burner = amplified(burner, repeat=2, times=150_000)  # each count scans 300,000 entries
    record = raw([honest[0], burner])
    assert len(record) < MAX_LINE_BYTES
    # (15 s: the honest check replays in well under a second, but a loaded CI machine can take seconds
    # to fork and replay it; the burner alone would run for minutes)
    verdict = replay_plan(PLAN, record, budget_s=15)
    assert verdict.results[(KV, 0)] == (True, ""), "what was replayed before the budget ran out stands"
    ok, message = verdict.results[(KV, 1)]
    assert not ok and "ran past its time budget of 15 s" in message, message
    assert verdict.seconds < 15 + 10


def doubles_a_list(config, bytes_per_elem):
    """Recorded with 3 doublings; the forged record doubles 40 times (8 TB of pointers)."""
    pages = config.eos_token_ids
    pages.append(0)
    extend = pages.extend
    for _ in range(3):
        extend(pages)
    return 0


def test_a_memory_bomb_runs_out_of_the_replays_memory_not_the_graders(tmp_path):
    [bomb] = recorded(tmp_path, doubles_a_list, seeds=(0,), name="bomb.jsonl")
    bomb = amplified(bomb, repeat=2, times=40)
    verdict = replay_plan({"c": [Planned(KV, 0, False)]}, raw([bomb]), budget_s=60, memory_mb=512)
    ok, message = verdict.results[(KV, 0)]
    assert not ok and "MemoryError" in message, message


class AlwaysEqual:
    """A student object equal to everything, in a pool that hands it out for every answer."""

    def __init__(self, *args, **kwargs):
        pass

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


def test_a_value_equal_to_everything_fails_in_the_kernel_and_in_replay(tmp_path):
    from autograder.checks.nb03_paged_kv import check_StudentBlockPool

    [entry] = recorded(tmp_path, AlwaysEqual, check=check_StudentBlockPool, seeds=(0,))
    rule = ("check_StudentBlockPool compares what your code returned: return plain values (int, float, str, list, "
            "tuple, dict, tensor), not an object of class AlwaysEqual")
    assert entry["outcome"]["msg"] == rule, entry["outcome"]
    assert replay(check_StudentBlockPool, entry) == (False, f"AssertionError: {rule}")


def test_the_replays_process_writes_no_file_and_holds_no_descriptor_of_the_graders(tmp_path):
    target = tmp_path / "written_by_the_child.txt"
    mine = os.open(tmp_path, os.O_RDONLY)  # a descriptor of the grader's: the child must not have it
    cwd = os.getcwd()

    def child(send):
        try:
            os.fstat(mine)
            send({"fd": "open"})
        except OSError:
            send({"fd": "closed"})
        try:
            with open(target, "w") as f:
                f.write("forged")
            send({"write": "done"})
        except OSError as exc:
            send({"write": type(exc).__name__})

    try:
        outcome = run_isolated(child, budget_s=30, memory_mb=256)
    finally:
        os.close(mine)
    said = {k: v for m in outcome.messages for k, v in m.items()}
    assert said["fd"] == "closed" and outcome.stopped is None, outcome
    assert not target.exists() or target.read_bytes() == b"", "no byte reaches a file"
    if landlock_abi() or os.geteuid() == 0:
        assert said["write"] == "PermissionError" and not target.exists(), said
    assert os.getcwd() == cwd
    assert isolation().startswith("replay in a forked process: ")


@pytest.mark.parametrize("how, reason", [
    (lambda: os.kill(os.getpid(), signal.SIGSEGV), "the replay's process died (SIGSEGV)"),
    (lambda: os._exit(3), "the replay's process exited with status 3"),
    (lambda: (_ for _ in ()).throw(ValueError("boom")), "the replay failed: ValueError: boom"),
])
def test_a_replay_process_that_dies_gives_a_reason(how, reason):
    outcome = run_isolated(lambda send: how(), budget_s=30, memory_mb=256)
    assert outcome.stopped == reason, outcome


def test_what_the_replays_process_answers_is_parsed_with_limits():
    def child(send):
        answer_pipe = next(fd for fd in range(3, 1 << 16) if _is_open(fd))  # the one left besides 0, 1, 2
        os.write(answer_pipe, b"[" * 10_000 + b"]" * 10_000 + b'\n{"ok":1}\nnot json\n[1]\n')

    outcome = run_isolated(child, budget_s=30, memory_mb=256)
    assert [m for m in outcome.messages if "isolation" not in m] == [{"ok": 1}], outcome.messages


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_parsing_leaves_the_collector_as_it_found_it():
    """parse_record pauses the garbage collector around each line's JSON (a speed-up): a line that is not
    JSON must not leave it off, and a caller that had it off keeps it off."""
    import gc

    raw = b'{"exercise": "x", "seed": 0, "events": []}\n{not json\n'
    assert gc.isenabled()
    rec = parse_record(raw)
    assert gc.isenabled() and len(rec.entries) == 1 and any("not JSON" in p for p in rec.problems)
    gc.disable()
    try:
        parse_record(raw)
        assert not gc.isenabled()
    finally:
        gc.enable()
