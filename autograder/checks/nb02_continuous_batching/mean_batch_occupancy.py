"""Notebook 02, `mean_batch_occupancy`: the duration-weighted mean share of seats taken, against its
definition."""
from __future__ import annotations

import random

from autograder._checking import _AssertionError as _CheckFailure
from autograder._checking import broke, call, check, expect, forbid_calls, plain_float, same_float, show
from course_lib.scheduler.output import StepStats


def _stats(rows):
    """rows: (num_running, num_waiting, duration[, idle time before the step])."""
    out, t = [], 0.0
    for i, (running, waiting, duration, *idle) in enumerate(rows):
        t += idle[0] if idle else 0.0
        out.append(StepStats(step=i, start_time=t, end_time=t + duration, num_running=running, num_waiting=waiting,
                             num_prefill_tokens=0, num_decode_tokens=running, num_padded_tokens=0,
                             context_tokens_read=0, attention_context_tokens=0, kv_tokens_written=running,
                             kv_used_slots=0, kv_allocated_slots=0, kv_total_slots=64, num_preemptions=0))
        t += duration
    return out


def _occupancy(rows, max_num_seqs):
    if not rows:
        return 0.0
    w = [row[2] for row in rows]
    if sum(w) == 0:
        w = [1.0] * len(rows)
    return sum(wi * row[0] for wi, row in zip(w, rows)) / (max_num_seqs * sum(w))


def _occupancy_hint(rows, seats, got) -> tuple[str, str]:
    """(the rule a plausible misreading breaks, a sentence naming it), or ("", "")."""
    n = len(rows)
    steps = _stats(rows)
    span = steps[-1].end_time - steps[0].start_time if steps else 0.0
    seated = sum(row[0] * row[2] for row in rows)
    weighted = "weighted by duration"
    alternatives = [
        (weighted, "equal weights because some step has no duration; equal weights only when NO step has one "
                   "(a zero-length step beside timed ones weighs nothing)",
         sum(row[0] for row in rows) / (seats * n)),
        (weighted, "an unweighted mean over steps; weight each step by its duration (end_time - start_time)",
         sum(row[0] for row in rows) / (seats * n)),
        (weighted, "the seat-seconds divided by the run's span (last end_time - first start_time); idle time "
                   "between steps is no step: divide by the sum of the steps' durations",
         seated / (seats * span) if span > 0 else None),
        ("a fraction of the seats", "the mean number of running requests; divide by max_num_seqs to get a fraction "
                                    "of the seats", _occupancy(rows, 1)),
        ("a fraction of the seats", "waiting requests as if they held seats; only num_running counts",
         _occupancy([(r + w, 0, d) for r, w, d, *_ in rows], seats)),
    ]
    mixed = any(row[2] == 0 for row in rows) and any(row[2] > 0 for row in rows)
    for rule, reason, value in alternatives:
        if value is None or (reason.startswith("equal weights because") and not mixed):
            continue
        if same_float(got, value) and not same_float(value, _occupancy(rows, seats)):
            return rule, f" It looks like you computed {reason}."
    return "", ""


def _occupancy_module():
    import course_lib.sim.occupancy as occupancy

    return [occupancy]


@check("mean_batch_occupancy")
def check_mean_batch_occupancy(impl, seed, allow_reference):
    rng = random.Random(seed)
    weighted_rule = "weighted by duration"
    seats = rng.choice([4, 8])
    cases = [([(2, 0, 1.0), (4, 3, 1.0), (1, 0, 2.0)], 4)]
    cases.append(([(rng.randint(0, seats), rng.randint(0, 5), rng.choice([0.5, 1.0, 2.0, 3.5])) for _ in range(7)], seats))
    cases.append(([(rng.randint(0, seats), rng.randint(0, 3), 0.0) for _ in range(4)], seats))  # untimed steps
    # Idle gaps between steps (the engine waited for arrivals): they are no step and weigh nothing.
    cases.append(([(rng.randint(1, seats), 0, rng.choice([0.5, 1.0]), rng.choice([0.0, 2.0, 6.5])) for _ in range(5)]
                  + [(seats, 0, 1.5, 4.0)], seats))
    # Timed and zero-length steps mixed: a zero-length step weighs nothing (the fallback is for NO duration).
    mixed = [(rng.randint(0, seats), 0, rng.choice([0.0, 0.0, 1.0, 2.5])) for _ in range(6)]
    cases.append((mixed + [(0, 1, 0.0), (seats, 0, 1.0)], seats))
    cases.append(([], seats))
    for rows, max_num_seqs in cases:
        steps = _stats(rows)
        gaps = [row[3] if len(row) > 3 else 0.0 for row in rows]
        shown = (f"mean_batch_occupancy(<{len(rows)} steps: num_running {[row[0] for row in rows]}, durations "
                 f"{[row[2] for row in rows]}" + (f", idle gaps before them {gaps}" if any(gaps) else "")
                 + f">, max_num_seqs={max_num_seqs})")
        with forbid_calls("mean_batch_occupancy", _occupancy_module(), enabled=not allow_reference):
            try:
                got = call(shown, impl, steps, max_num_seqs)
            except _CheckFailure as failure:  # a crash on the cases a rule is about names that rule
                if not rows:
                    broke("no steps", f"{failure} (no steps at all: return 0.0)")
                if all(row[2] == 0 for row in rows):
                    broke("untimed steps equal", f"{failure} (no step has a duration: weigh the steps equally)")
                raise
        want = _occupancy(rows, max_num_seqs)
        expect(plain_float(got) is not None, lambda: f"{shown} must return a float, got {show(got)}",
               rule="a fraction of the seats")
        got = plain_float(got)
        if not rows:
            expect(got == 0.0, f"{shown}: no steps means an occupancy of 0.0, got {got!r}", rule="no steps")
            continue
        if all(row[2] == 0 for row in rows) and not same_float(got, want):
            broke("untimed steps equal",
                  f"{shown} = {got!r}, expected {want!r}: when no step has a duration, weigh the steps equally")
        if not same_float(got, want):
            rule, hint = _occupancy_hint(rows, max_num_seqs, got)
            broke(rule or weighted_rule, f"{shown} = {got!r}, expected {want!r} (time-weighted mean of "
                                         f"num_running / max_num_seqs).{hint}")
