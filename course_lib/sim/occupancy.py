"""How full the batch is: the time-weighted share of the seats that requests hold.

Each step counts for its duration (a prefill step computes many more tokens than a decode step
and lasts longer); when no step has a duration (a clock that never moved) the steps count
equally. No steps: 0.0. Notebook 2's exercise of the same name is held to this.
"""
from __future__ import annotations

from collections.abc import Sequence

from course_lib.sim.metrics import step_weights


def mean_batch_occupancy(step_stats: Sequence, max_num_seqs: int) -> float:
    if not step_stats:
        return 0.0
    weights = step_weights(step_stats)
    held = sum(w * s.num_running for w, s in zip(weights, step_stats))
    return float(held / (max_num_seqs * weights.sum()))
