"""REPLAY side: the grader's own process reads the sandbox's record (plain JSON lines, parsed
with limits, never unpickled) and re-runs each check on each graded seed against a stub that
answers from the record. The verdict is the replay's; see `autograder.membrane`.
"""
from __future__ import annotations

import json
from pathlib import Path

MAX_LINE_BYTES = 256 << 20
MAX_LINES = 2000


def read_records(path) -> tuple[list[dict], list[str]]:
    """The record's entries (dicts with exercise, seed, events, ...) and problems found reading it."""
    path = Path(path)
    problems: list[str] = []
    entries: list[dict] = []
    if not path.is_file():
        return entries, ["no record came back from the sandbox"]
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno > MAX_LINES:
                problems.append(f"the record has more than {MAX_LINES} check calls: the rest is ignored")
                break
            if len(raw) > MAX_LINE_BYTES:
                problems.append(f"record line {lineno} is larger than {MAX_LINE_BYTES >> 20} MB: ignored")
                continue
            try:
                entry = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                problems.append(f"record line {lineno} is not JSON: ignored")
                continue
            if not (isinstance(entry, dict) and isinstance(entry.get("exercise"), str)
                    and isinstance(entry.get("seed"), int) and isinstance(entry.get("events"), list)):
                problems.append(f"record line {lineno} is malformed: ignored")
                continue
            entries.append(entry)
    return entries, problems


def replay(check_fn, entry: dict) -> tuple[bool, str]:
    """(passed, message) of `check_fn` replayed on one recorded call."""
    from . import _checking
    from .membrane import Divergence, Membrane, RecordLimit

    info = entry.get("impl") if isinstance(entry.get("impl"), dict) else {}
    m = Membrane("replay", events=entry["events"])
    stub = m.root(info={"c": bool(info.get("c", True)), "t": bool(info.get("t", False))})
    _checking._ACTIVE = None
    try:
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
    except Exception as exc:  # noqa: BLE001 - a malformed record can make the check fail oddly
        return False, f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        _checking._ACTIVE = None
    if m.poisoned:
        return False, f"the record of your code does not answer what the check asks: {m.poisoned}"
    return True, ""
