"""Checks for notebook 07 (admission control): the watermark policy, the preemption report, the
break-it experiment the student designs, and preemption by recompute written by the student.

The policy is compared with its definition on a grid of pool states (free pages, the request's
own need, cached pages to revive, the exact boundary), then plugged into the real engine: under
load every one of its decisions is compared with the definition at the moment it is made, and a
float64 model served through it must keep its greedy tokens. The recompute hooks
(`SchedulerBase.choose_victim` / `preempt`, overridden on course_lib's ContinuousScheduler) are
called on a live engine, then serve a thrashing float64 workload next to course_lib's scheduler.
"""
from __future__ import annotations

from .break_it_config import check_break_it_config, failure_reasons, largest_request_slots, run_break_it
from .preemption_report import check_preemption_report
from .student_recompute import check_StudentRecompute
from .student_watermark import check_StudentWatermark
