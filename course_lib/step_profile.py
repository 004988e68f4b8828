"""Where each engine step's time goes, recorded by the engine and the runner themselves.

Off unless asked for (`LLMEngine.profile_steps()`); when off, nothing here runs and the step pays
one `is None` test in the engine and up to four in the runner. When on, every step adds one row of
nanoseconds per phase. The phases follow the step in order and together make up all of it, from
the engine's first clock read to the end of its bookkeeping:

- `schedule`: `scheduler.next_step()`: who runs, how many tokens each, pages made room for;
- `prepare`: the rest of `runner.execute`: the flat batch (token ids, positions, slots, block
  tables), the rows to sample, and the call itself (all of `execute` for a runner that records
  no forward, like the scripted one);
- `forward`: the model's forward pass (eager: the PyTorch model; or the whole step in one C call);
- `sample`: logits to tokens;
- `update`: `scheduler.update` (progress, stops, freed pages) and the engine's record of the step.

Parts of `forward` (already counted in it; zero where they did not run): `attention` (eager
forward: writing each layer's K/V into its pages and attending over them) and `c_forward` (the
whole forward in one C call, model/cpu_forward.py).
"""
from __future__ import annotations

from time import perf_counter_ns

PHASES = ("schedule", "prepare", "forward", "sample", "update")
PARTS = ("attention", "c_forward")  # inside `forward`


class StepProfile:
    """One row per step: `{phase or part: nanoseconds}`. The engine opens a row and marks the ends
    of its stages; the runner adds what it measured inside `execute`."""

    def __init__(self):
        self.rows: list[dict[str, int]] = []
        self._row: dict[str, int] | None = None
        self._last = 0  # the clock at the engine's last mark

    # -- the engine ----------------------------------------------------------------------------
    def begin(self) -> None:
        """A step starts: a new row."""
        self._row = dict.fromkeys(PHASES + PARTS, 0)
        self.rows.append(self._row)
        self._last = perf_counter_ns()

    def mark(self, phase: str) -> None:
        """`phase` (a stage of the engine: schedule or update) ended now."""
        now = perf_counter_ns()
        self._row[phase] += now - self._last
        self._last = now

    def mark_execute(self) -> None:
        """`runner.execute` returned: what the runner did not record as forward or sample was
        preparing its inputs."""
        now = perf_counter_ns()
        row = self._row
        row["prepare"] += now - self._last - row["forward"] - row["sample"]
        self._last = now

    # -- the runner ----------------------------------------------------------------------------
    def add(self, phase: str, ns: int) -> None:
        """The runner measured `ns` nanoseconds of `phase` (forward, sample) or of a part."""
        self._row[phase] += ns

    # -- reading ------------------------------------------------------------------------------
    def totals(self) -> list[int]:
        """Each step's whole time: the sum of its phases."""
        return [sum(row[p] for p in PHASES) for row in self.rows]
