"""The grader's verdict on one notebook: which checks each test cell asks for, their replay, and
feedback that never shows hidden tests.

A test cell's plan comes from its source as the *instructor* wrote it (restored from the source
notebook, so the student cannot change it): every call `check_<adapter>(<name>, seed=<int>)` in
it, parsed with `ast` (a seed that is not a literal means every literal seed the cell gives that
check, and the visible seed: the grader knows no other, the hidden seeds being only in the
instructor's notebooks, autograder/hidden_seeds.py). A call
between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` is hidden: its failure message is
withheld (it would describe the hidden inputs). The cell earns its points only if it passed in
the kernel (that evidence can only lower a score) AND every planned check passes in replay.
"""
from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass

from .cell_plan import Planned, check_calls, plan_cell  # noqa: F401  (importable from here)


def cell_plan(source: str, hidden_ranges: list[tuple[int, int]]) -> list[Planned]:
    from .exercises import BY_ADAPTER

    return plan_cell(source, hidden_ranges, lambda exercise: getattr(BY_ADAPTER.get(exercise), "visible_seed", 0))


def find_check(exercise: str):
    """The grader's own check function for an exercise (None if there is none)."""
    from .checks import CHECKS, MODULES

    modules = [CHECKS[exercise]] if exercise in CHECKS else list(MODULES)
    for module in modules:
        try:
            fn = getattr(importlib.import_module(f"autograder.checks.{module}"), f"check_{exercise}", None)
        except ImportError:
            continue
        if fn is not None:
            return fn
    return None


REPLAY_MIN_S = 60  # the replay's time budget when the notebook's run left it less


def replay_budget(budget_s: float, spent_s: float) -> float:
    """The replay's time budget: what the notebook's budget has left, and at least REPLAY_MIN_S
    (an honest record replays in seconds; a notebook that used its whole budget still gets its
    replay), so one notebook costs the grader at most its budget and a minute."""
    return max(min(REPLAY_MIN_S, budget_s), budget_s - spent_s)


@dataclass
class ReplayVerdict:
    results: dict  # (exercise, seed) -> (passed, message) for every planned check
    entries: list  # the record's lines as evidence (exercise, seed, code, thread_reference_calls), no events
    problems: list  # what was wrong with the record or its replay (the notebook's errors)
    flags: list  # the record was edited (the notebook's flags)
    isolation: str = ""  # what the replay's process got (autograder.replay_process)
    seconds: float = 0.0


def replay_plan(plans: dict[str, list[Planned]], record: bytes | None, *, budget_s: float = 900,
                memory_mb: int | None = None) -> ReplayVerdict:
    """Replay every planned check from the record's bytes (autograder.replay.load_record), in a
    child process under `budget_s` seconds and `memory_mb` more address space
    (autograder.replay_process): the record is parsed there, never in the grader's process."""
    from .replay_process import run_isolated
    from .sandbox import Limits

    wanted = sorted({(p.exercise, p.seed) for plan in plans.values() for p in plan})
    checks = {exercise: find_check(exercise) for exercise, _ in wanted}  # imported here, before the fork
    _prepare_replay()
    outcome = run_isolated(lambda send: _replay_in_child(send, record, wanted, checks), budget_s=budget_s,
                           memory_mb=memory_mb or Limits().memory_mb)
    verdict = ReplayVerdict(results={}, entries=[], problems=[], flags=[], isolation=outcome.isolation,
                            seconds=outcome.seconds)
    wanted_set = set(wanted)
    for message in outcome.messages:
        result = message.get("result")
        if (isinstance(result, list) and len(result) == 4 and isinstance(result[0], str) and type(result[1]) is int
                and isinstance(result[2], bool) and isinstance(result[3], str)
                and (result[0], result[1]) in wanted_set):
            verdict.results.setdefault((result[0], result[1]), (result[2], result[3][:4000]))
        parsed = message.get("record")
        if isinstance(parsed, dict):
            verdict.problems += _strings(parsed.get("problems"), 50, 1000)
            verdict.flags += _strings(parsed.get("flags"), 50, 1000)
            verdict.entries += _evidence(parsed.get("evidence"))
    for exercise, seed in wanted:
        if (exercise, seed) not in verdict.results:
            why = outcome.stopped or "the replay ended before it"
            verdict.results[(exercise, seed)] = (False, f"check_{exercise}(seed={seed}) was not replayed: {why}")
    if outcome.stopped:
        verdict.problems.append(outcome.stopped)
    return verdict


def _strings(value, count: int, length: int) -> list[str]:
    return [str(x)[:length] for x in value[:count] if isinstance(x, str)] if isinstance(value, list) else []


def _evidence(value) -> list[dict]:
    out = []
    for item in value[:2000] if isinstance(value, list) else []:
        if isinstance(item, dict) and isinstance(item.get("exercise"), str) and type(item.get("seed")) is int:
            code = [[s[:300] for s in x] for x in item.get("code", [])[:200] if isinstance(x, list) and len(x) <= 4
                    and all(isinstance(s, str) for s in x)] if isinstance(item.get("code"), list) else []
            out.append({"exercise": item["exercise"][:100], "seed": item["seed"], "code": code,
                        "thread_reference_calls": _strings(item.get("thread_reference_calls"), 20, 300)})
    return out


@functools.cache  # once per process
def _prepare_replay() -> None:
    """Once per process, before the first fork: import course_lib's engine packages (the replay
    looks the record's classes up among imported modules, never imports one for it) and build
    course_lib's C kernels (the replay's process may write no file, so it could not build them)."""
    import pkgutil

    from .callbacks import ENGINE_PACKAGES

    for package in ENGINE_PACKAGES:
        try:
            module = importlib.import_module(package)
            for info in pkgutil.walk_packages(getattr(module, "__path__", []), package + "."):
                importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional backend (triton) that does not import here
            continue
    for name in ("course_lib.attention.cpu_decode", "course_lib.model.cpu_forward"):
        try:
            importlib.import_module(name).available()
        except Exception:  # noqa: BLE001 - no compiler: the engine falls back to torch, in both runs
            continue


def _replay_in_child(send, raw, wanted, checks) -> None:
    """In the replay's process: parse the record with its limits, then replay each planned check."""
    from .replay import parse_record, replay

    record = parse_record(raw, wanted=set(wanted))
    evidence = {}
    for entry in record.entries:
        item = {"exercise": entry["exercise"], "seed": entry["seed"], "code": entry.get("code"),
                "thread_reference_calls": entry.get("thread_reference_calls")}
        evidence.setdefault(json.dumps(item, sort_keys=True, default=str)[:100_000], item)
    send({"record": {"problems": record.problems[:50], "flags": list(dict.fromkeys(record.flags))[:50],
                     "evidence": list(evidence.values())[:2000]}})
    by_key: dict[tuple[str, int], list[dict]] = {}
    for entry in record.entries:
        if entry["events"] is not None:
            by_key.setdefault((entry["exercise"], entry["seed"]), []).append(entry)
    for key in wanted:
        exercise, seed = key
        fn = checks.get(exercise)
        if fn is None:
            verdict = (False, f"the grader has no check_{exercise}")
        elif key in record.refused and key not in by_key:
            verdict = (False, record.refused[key])
        elif key not in by_key:
            verdict = (False, f"check_{exercise}(seed={seed}) never ran in the sandbox (the test cell stopped "
                              "before it, or its record was lost)")
        else:
            verdict = (True, "")
            for entry in by_key[key][:4]:
                ok, message = replay(fn, entry)
                if not ok:
                    verdict = (False, message)
                    break
        send({"result": [exercise, seed, verdict[0], verdict[1][:4000]]})


HIDDEN_MESSAGE = ("a hidden test of {exercise} failed; its message is withheld because it would show the hidden "
                  "inputs. Test your code on more cases than the visible ones.")


def cell_verdict(plan: list[Planned], results) -> tuple[bool, str]:
    """(passed, feedback) of a test cell's planned checks."""
    for p in sorted(plan, key=lambda p: p.hidden):
        ok, message = results.get((p.exercise, p.seed), (False, "not replayed"))
        if not ok:
            return False, HIDDEN_MESSAGE.format(exercise=p.exercise) if p.hidden else message
    return True, ""


class Redactor:
    """Removes every line of the source's hidden tests from text shown to the student."""

    def __init__(self, hidden_lines: list[str]):
        self.lines = sorted({line for line in hidden_lines if len(line) >= 8}, key=len, reverse=True)

    def __call__(self, text):
        if not isinstance(text, str) or not self.lines:
            return text
        for line in self.lines:
            if line in text:
                text = text.replace(line, "[hidden test]")
        return text
