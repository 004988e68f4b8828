"""Clocks: where the engine's timestamps come from.

The protocol (anything with these three methods will do):

    now() -> float          seconds since the clock started. The engine stamps arrivals,
                            step starts, first tokens and finishes with it.
    charge(stats) -> float  called once after every engine step with that step's
                            `StepStats` (the engine does it in `step()`); returns the
                            step's duration in seconds.
    wait_until(t) -> None   called by the simulator when nothing can run before time `t`
                            (e.g. the next open-loop arrival).

`WallClock` (what this machine really did) lives here, below the engine, which uses it by
default; the simulated GPU clock (`course_lib.sim.clock.SimulatedClock`) sits in the simulator,
above it. See that module for how a step's time is accounted under each.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def charge(self, stats) -> float: ...

    def wait_until(self, t: float) -> None: ...


class WallClock:
    """What this machine really did: `time.perf_counter()` since construction."""

    def __init__(self, skip_idle: bool = False):
        self._start = time.perf_counter()
        self._skipped = 0.0  # idle time jumped over (skip_idle only)
        self.skip_idle = skip_idle

    def now(self) -> float:
        return time.perf_counter() - self._start + self._skipped

    def charge(self, stats) -> float:
        return float(stats.end_time - stats.start_time)

    def wait_until(self, t: float) -> None:
        if self.skip_idle:
            self._skipped += max(0.0, t - self.now())
