"""REPLAY side: the sandbox's record is data, never instructions.

The grader reads the record (plain JSON lines, never unpickled) with limits checked *before*
anything is parsed: the whole record's bytes, each line's bytes, each line's bracket nesting (a
linear scan outside strings), then the number of check calls and of events. A line that breaks a
limit is a zero for its check with the reason ("the record of check_X(seed=1) is nested deeper
than 200 levels"), never a grader error. Each check is then re-run on each graded seed against a
stub that answers from the record (`replay`; see `autograder.membrane`), in a child process of
its own under the notebook's budget (`autograder.replay_process`, `autograder.verdict`).

The limits come from the course's honest records (every exercise's reference, controls and
mutants on every graded seed, measured 2026-12-02): the largest line is budget_sweep's, 9.1 MB and
178,000 events, nested 11 levels; a whole notebook's record stays under 40 MB (02: three
StudentScheduler and three budget_sweep calls). Each limit is about four times that.
"""
from __future__ import annotations

import contextlib
import gc
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .recording.errors import MAX_EVENTS  # crossings of one check call: the recorder stops at it too

MAX_RECORD_BYTES = 160 << 20  # the whole record of one notebook
MAX_LINE_BYTES = 40 << 20  # one check call
MAX_DEPTH = 200  # brackets: the membrane encodes values up to 60 levels deep (a dict level is 3)
MAX_LINES = 2000  # check calls

# What the recorder writes on every line (autograder.record.through_membrane), besides exercise,
# seed and events: a line without one of them was edited. (A line the recorder wrote once the
# record was full holds no events and says so: it fails its check anyway.)
RECORDER_FIELDS = {"impl": dict, "code": list, "outcome": dict, "thread_reference_calls": list}

# How the recorder starts a line (json.dumps of a dict whose first keys are exercise and seed):
# used to name the check of a line too large or too deep to parse.
_LINE_START = re.compile(rb'\{"exercise":"([A-Za-z_][A-Za-z0-9_]{0,99})","seed":(-?[0-9]{1,18})[,}]')


@dataclass
class Record:
    """The record of one notebook as the grader parsed it."""
    entries: list[dict] = field(default_factory=list)  # usable lines (exercise, seed, events, ...)
    problems: list[str] = field(default_factory=list)  # what was wrong with it (for the errors)
    refused: dict[tuple[str, int], str] = field(default_factory=dict)  # (exercise, seed) -> why its line is a zero
    flags: list[str] = field(default_factory=list)  # evidence the record was edited
    ignored: int = 0  # lines for checks no test cell calls (shown as a count, never by their text)


def load_record(path) -> tuple[bytes | None, list[str]]:
    """The record's bytes (at most MAX_RECORD_BYTES, cut at a line end), and problems; never parsed here."""
    path = Path(path)
    if not path.is_file():
        return None, ["no record came back from the sandbox"]
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        return None, [f"the record could not be read ({type(exc).__name__})"]
    if len(raw) <= MAX_RECORD_BYTES:
        return raw, []
    raw = raw[:raw.rfind(b"\n", 0, MAX_RECORD_BYTES) + 1]
    return raw, [f"the record is larger than {MAX_RECORD_BYTES >> 20} MB: the check calls after its first "
                 f"{MAX_RECORD_BYTES >> 20} MB are ignored"]


def nesting_depth(line: bytes) -> int:
    """How deep the brackets of a JSON line nest, outside strings: a linear scan (C-speed byte
    operations), so that nothing recursive ever meets a line nested too deep."""
    import numpy as np

    # An escaped backslash, then an escaped quote, are no string delimiters (a run of backslashes
    # escapes pairwise, left to right, as JSON reads it).
    bare = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(bare.split(b'"')[::2])
    brackets = outside.translate(None, bytes(b for b in range(256) if b not in b"[]{}"))
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.uint8)
    depth = np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1).astype(np.int32))
    return int(depth.max())


def _named(line: bytes) -> tuple[str, int] | None:
    m = _LINE_START.match(line[:200])
    return (m.group(1).decode(), int(m.group(2))) if m else None


def edited(entry: dict) -> list[str]:
    """Evidence that a line was edited: a field the recorder always writes is missing or malformed."""
    outcome = entry.get("outcome")
    if entry.get("events") == [] and isinstance(outcome, dict) and outcome.get("type") == "RecordLimit":
        return []  # what the recorder writes once the record is full
    missing = [name for name, kind in RECORDER_FIELDS.items() if not isinstance(entry.get(name), kind)]
    if not missing:
        return []
    return [f"check_{entry['exercise']}(seed={entry['seed']}): the record was edited (its line lacks the "
            f"{', '.join(repr(m) for m in missing)} the recorder always writes)"]


def _asked(key, wanted):
    """The line's (exercise, seed) when a test cell asks for it; None (shown as "record line N") else."""
    return key if key is None or wanted is None or key in wanted else None


# What the recorder writes for a call into an exercise's counterpart (record.ReferenceWatch._note):
# "<course_lib module>.<function> (another thread | called by your code)". Anything else in that
# field is the student's text and is dropped, so the field cannot carry what their code saw.
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,60}(?:\.[A-Za-z_][A-Za-z0-9_]{0,60}){0,6}) "
                   r"\((?:another thread|called by your code)\)")


def recorder_calls(entry: dict) -> list[str] | None:
    """The line's counterpart calls as the recorder writes them, for the exercise's own counterpart."""
    from .record import counterpart_modules

    calls = entry.get("thread_reference_calls")
    if not isinstance(calls, list):
        return calls if calls is None else None
    modules = counterpart_modules(entry["exercise"])
    kept = []
    for call in calls[:20]:
        m = _CALL.fullmatch(call) if isinstance(call, str) else None
        module, _, name = m.group(1).rpartition(".") if m else ("", "", "")
        # (and the function is one of that module's own: a made-up name would be a message)
        if module in modules and callable(getattr(sys.modules.get(module), name, None)):
            kept.append(call)
    return kept


def parse_record(raw: bytes | None, wanted=None) -> Record:
    """Parse a record's bytes with the limits. `wanted`: the (exercise, seed) pairs to replay; the
    events of other lines (and of a pair's fifth line on) are dropped after their evidence is read."""
    rec = Record()
    if raw is None:
        return rec
    seen: dict[tuple[str, int], int] = {}
    start, lineno = 0, 0
    while start < len(raw):
        end = raw.find(b"\n", start)
        end = len(raw) if end < 0 else end
        line, start = raw[start:end], end + 1
        if not line.strip():
            continue
        lineno += 1
        if lineno > MAX_LINES:
            rec.problems.append(f"the record has more than {MAX_LINES} check calls: the rest is ignored")
            break
        why = None
        if len(line) > MAX_LINE_BYTES:
            why = f"is {len(line) >> 20} MB, over the {MAX_LINE_BYTES >> 20} MB limit of one check call"
        elif nesting_depth(line) > MAX_DEPTH:
            why = f"is nested deeper than {MAX_DEPTH} levels (the recorder never writes that)"
        if why:
            _refuse(rec, _asked(_named(line), wanted), lineno, why)
            continue
        try:
            with _collector_paused():
                entry = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            _refuse(rec, _asked(_named(line), wanted), lineno, "is not JSON")
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("exercise"), str) and len(entry["exercise"]) <= 100
                and type(entry.get("seed")) is int and isinstance(entry.get("events"), list)):
            _refuse(rec, _asked(_named(line), wanted), lineno, "is malformed")
            continue
        key = (entry["exercise"], entry["seed"])
        if wanted is not None and key not in wanted:
            # A line for a check no test cell calls: nothing of it is shown (its names and evidence
            # are the student's text, and the student's code saw the hidden inputs).
            rec.ignored += 1
            continue
        entry["thread_reference_calls"] = recorder_calls(entry)
        if len(entry["events"]) > MAX_EVENTS:
            _refuse(rec, key, lineno, f"holds {len(entry['events'])} events, over the limit of {MAX_EVENTS}")
            continue
        rec.flags += edited(entry)
        seen[key] = seen.get(key, 0) + 1
        if (wanted is not None and key not in wanted) or seen[key] > 4:
            entry["events"] = None  # evidence only: never replayed
        rec.entries.append(entry)
    if rec.ignored:
        rec.problems.append(f"{rec.ignored} record line(s) name checks that no test cell calls: ignored")
    return rec


@contextlib.contextmanager
def _collector_paused():
    """The garbage collector off while one line is parsed. Parsing allocates millions of containers, and
    each of the collector's passes walks every object of the process (torch's included): a 13 MB line
    took 0.65-0.87 s with it on and 0.32-0.46 s off. Parsed JSON holds no cycles, so it leaves no
    garbage only the collector could free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _refuse(rec: Record, key, lineno: int, why: str) -> None:
    if key is None:
        rec.problems.append(f"record line {lineno} {why}: ignored")
        return
    reason = f"the record of check_{key[0]}(seed={key[1]}) {why}"
    rec.problems.append(f"{reason}: ignored")
    rec.refused.setdefault(key, reason)


def read_records(path) -> tuple[list[dict], list[str]]:
    """The record's entries (dicts with exercise, seed, events, ...) and problems found reading it."""
    raw, problems = load_record(path)
    rec = parse_record(raw)
    return rec.entries, problems + rec.problems


def replay(check_fn, entry: dict) -> tuple[bool, str]:
    """(passed, message) of `check_fn` replayed on one recorded call."""
    from ._checking import describe_exception, fail
    from .recording.active import activated
    from .recording.errors import Divergence, RecordLimit
    from .recording.machine import Membrane

    info = entry.get("impl") if isinstance(entry.get("impl"), dict) else {}
    m = Membrane("replay", events=entry["events"], exercise=entry.get("exercise"), fail=fail,
                 describe_exception=describe_exception)
    stub = m.root(info={"c": bool(info.get("c", True)), "t": bool(info.get("t", False))})
    try:
        with activated(None):  # the check's own call activates the membrane of its stub
            check_fn(stub, seed=entry["seed"])
    except Divergence as exc:
        return False, f"the record of your code does not answer what the check asks: {exc}"
    except RecordLimit as exc:
        return False, f"the record is too large: {exc}"
    except AssertionError as exc:
        return False, f"AssertionError: {exc}"
    except NotImplementedError as exc:
        return False, "NotImplementedError: this exercise is not finished yet" + (f" ({exc})" if str(exc) else "")
    except RecursionError:
        return False, "RecursionError while replaying the record"
    except MemoryError:
        return False, "the replay of the record ran out of memory (the grader's memory budget for it)"
    except Exception as exc:  # noqa: BLE001 - a malformed record can make the check fail oddly
        return False, f"{type(exc).__name__}: {exc}"[:2000]
    if m.poisoned:
        return False, f"the record of your code does not answer what the check asks: {m.poisoned}"
    return True, ""
