"""Checks for notebook 02 (continuous batching): the turnstile scheduler, batch occupancy, and the
token-budget sweep (chunked prefill, measured).

The student's scheduler class is plugged into the real engine (`LLMEngine(..., scheduler=...)`):
once serving a float64 model (greedy tokens must equal the dense model's), and several times with
the scripted runner (no compute) while every step is inspected against the rules the notebook
states: the token budget, the seats, running requests first, every free seat refilled in the same
step, first come first served (nobody overtakes the head of the queue), no admission in a step
that preempted, the admission policy obeyed, chunked prefill on and off (a prompt too big for the
whole budget runs alone), prefix-cache hits skipped (the exact hit counter), finished requests
retired with their pages freed, and no page leaked.

The budget sweep is run on the check's own small workload (idle gaps, one-token answers, prompts
longer than the budget, budgets out of order, a non-default seat count) under the simulated
clock, where every number is deterministic: each row must equal course_lib's measurement, the
curve must show the trade-off, and a second run must give the same rows. The harness's clock stops a
driver loop that spins without stepping (SPIN_CAP reads), so a `<` for `<=` fails in milliseconds.

Every failure of a rule the notebook states starts `Rule "<short name>":`, the name of the notebook's
collapsed block "The rules the check holds you to".
"""
from __future__ import annotations

from .budget_sweep import check_budget_sweep
from .mean_batch_occupancy import check_mean_batch_occupancy
from .student_scheduler import check_StudentScheduler
