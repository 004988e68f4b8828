"""Clocks: where the engine's timestamps come from.

The protocol (both clocks implement it; anything with these three methods will do):

    now() -> float          seconds since the clock started. The engine stamps arrivals,
                            step starts, first tokens and finishes with it.
    charge(stats) -> float  called once after every engine step with that step's
                            `StepStats` (the engine does it in `step()`); returns the
                            step's duration in seconds.
    wait_until(t) -> None   called by the simulator when nothing can run before time `t`
                            (e.g. the next open-loop arrival).

How a step's time is accounted:

- `WallClock`: time passes by itself. `charge` changes nothing and reports the measured
  `stats.end_time - stats.start_time`. `wait_until` returns at once (the simulator never
  sleeps; it sees real time pass between steps), unless `skip_idle=True`, in which case the
  clock jumps forward to `t` so that an idle gap of an open-loop trace costs no real time.
- `SimulatedClock`: time passes only when told. `charge` advances it by the roofline cost of
  the step on the named GPU (deterministic: same steps, same times); `wait_until` jumps
  forward to `t` if `t` is later.

Under the simulated clock `now()` does not move *during* a step: it reads the step's start
until `charge` is called, and the step's end afterwards. So tokens a step produces are
stamped after `charge`, and `stats.end_time = clock.now()` is set after charging (which is
what `LLMEngine.step` does).
"""
from __future__ import annotations

from course_lib.clock import Clock, WallClock  # noqa: F401  (they live below the engine; imported from here too)
from course_lib.sim.hardware import GPUSpec, ModelShape, get_gpu, get_model_shape
from course_lib.sim.roofline import DEFAULT_STEP_OVERHEAD_S, RooflineCost, cost_of_step


class SimulatedClock:
    """A GPU that is not here: each step costs its roofline time on `gpu` for a model of `shape`."""

    def __init__(
        self,
        gpu: GPUSpec | str = "H100",
        shape: ModelShape | str = "llama-3-8b",
        overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
        start: float = 0.0,
    ):
        self.gpu = get_gpu(gpu)
        self.shape = get_model_shape(shape)
        self.overhead_s = overhead_s
        self._t = float(start)
        self.last_cost: RooflineCost | None = None  # the most recent step's breakdown, for plots
        self.busy_s = 0.0  # total charged step time (the rest of now() was idle)
        self.draft_s = 0.0  # the part of busy_s a draft model's passes took (speculative decoding)

    def now(self) -> float:
        return self._t

    def charge(self, stats) -> float:
        self.last_cost = cost_of_step(stats, self.gpu, self.shape, self.overhead_s)
        self._t += self.last_cost.total_s
        self.busy_s += self.last_cost.total_s
        self.draft_s += self.last_cost.draft_s
        return self.last_cost.total_s

    def wait_until(self, t: float) -> None:
        self._t = max(self._t, float(t))
