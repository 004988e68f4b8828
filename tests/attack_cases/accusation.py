"""Issue 23, area "accusation": a copy flag only for code the student wrote.

Honest submissions, written without the solution, that the grader used to flag as copies:

- notebook 2's `StudentScheduler(SchedulerBase)`, which inherits the base's methods as the
  notebook tells it to (27 flags: "SchedulerBase._admit runs the same bytecode as course_lib...");
- notebook 7's `StudentRecompute(ContinuousScheduler)`, whose `preempt` is hint 2 written out
  (the base's own `preempt`) and which inherits the rest;
- notebook 3's `slot_mapping` as the natural loop (the answer key's) and `paged_waste` with
  `math.ceil` (a control's): short functions two honest students write alike;
- notebook 4's launcher `paged_attention_triton`, given by the notebook outside the solution
  region (the answer key's too), whose given `require_finished` also reads `inspect.getsource`.

Each must come back with no flag and no copy. And one real copy that must still be flagged, with
the evidence side by side: course_lib's `SchedulerBase._admit` pasted into the student's class.

Each honest case fails on the grader before this area's fix (measured: 27, 35, 2 and 5 flags on
the same code); the sources are the course's notebooks trimmed to the exercise (a preamble, the
cells the test cell needs, the answer cell and its test cell).
"""
from __future__ import annotations

import inspect
import textwrap

import nbformat
from nbformat.v4 import new_code_cell

from autograder import grade as G
from autograder.submissions import released_submission, with_answer
from course_lib.scheduler.base import SchedulerBase

from . import ROOT, AttackCase

SCHEDULER = ("02_continuous_batching", "StudentScheduler", "StudentScheduler_tests")
RECOMPUTE = ("07_admission_control", "StudentRecompute", "StudentRecompute_tests")
SLOTS = ("03_paged_kv", "slot_mapping", "slot_mapping_tests")
LAUNCHER = ("04_paged_attention", "paged_attention_triton", "paged_attention_triton_tests")

# Cells kept besides the answer and test cells: (assignment) -> text a kept cell contains.
NEEDS = {
    "02_continuous_batching": ("from course_lib.scheduler.base import SchedulerBase", "def entry("),
    "07_admission_control": ("from course_lib.scheduler.admission import", "def watch_preemptions("),
    "03_paged_kv": (),
    "04_paged_attention": ("from course_lib.attention.triton_decode import paged_decode_triton", "def make_case("),
}
GRADED = {  # (assignment) -> grade ids of the answer and test cells kept
    "02_continuous_batching": ("StudentScheduler", "StudentScheduler_tests"),
    "07_admission_control": ("StudentRecompute", "StudentRecompute_tests"),
    "03_paged_kv": ("slot_mapping", "slot_mapping_tests", "kv_waste", "kv_waste_tests"),
    "04_paged_attention": ("paged_attention_triton", "paged_attention_triton_tests"),
}

HONEST_SCHEDULER = '''class StudentScheduler(SchedulerBase):
    """The turnstile: every step, seated requests advance first, then free seats are refilled."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens

        def grant(pending):
            if self.enable_chunked_prefill:
                return min(pending, budget)
            if pending <= budget or budget == self.max_num_batched_tokens:
                return pending
            return 0

        idx = 0
        while idx < len(self.running) and budget > 0:
            req = self.running[idx]
            n = grant(req.num_pending_tokens)
            if n == 0 or not self._make_room(req, n, out):
                break
            self.kv.allocate(req, n)
            out.scheduled.append(entry(req, n))
            budget -= n
            idx += 1
        while self.waiting and budget > 0 and not out.preempted and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            cached = self.kv.lookup_prefix(head)
            n = grant(head.num_tokens - len(cached) * self.kv.page_size)
            if n == 0 or not self.kv.can_allocate(head, n, cached):
                break
            if not self.admission.can_admit(head, n, cached, self.kv, self.running):
                break
            self.waiting.popleft()
            self._admit(head, n, cached)
            out.scheduled.append(entry(head, n))
            budget -= n
        return out

    def finish(self, request) -> list:
        """`request` produced its last token: it leaves its seat and gives back its pages at once."""
        self.running.remove(request)
        self.kv.free(request)
        return [request]
'''

# The same class with course_lib's `_admit` pasted into its body: written out, not inherited.
PASTED_ADMIT = "from course_lib.scheduler.request import Request, RequestStatus\n\n\n" + HONEST_SCHEDULER.replace(
    "    def finish(self, request) -> list:",
    textwrap.indent(textwrap.dedent(inspect.getsource(SchedulerBase._admit)), "    ")
    + "\n    def finish(self, request) -> list:")

HONEST_RECOMPUTE = '''from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.scheduler.request import RequestStatus


class StudentRecompute(ContinuousScheduler):
    """course_lib's continuous scheduler, with your preemption by recompute."""

    def choose_victim(self):
        return self.running[-1]

    def preempt(self, request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
'''

HONEST_SLOTS = '''def slot_mapping(block_table, page_size, start, count):
    slots = []
    for pos in range(start, start + count):
        page = block_table[pos // page_size]
        slots.append(page * page_size + pos % page_size)
    return slots
'''

HONEST_WASTE = '''import math


def paged_waste(num_tokens_per_request, page_size):
    reserved = sum(math.ceil(n / page_size) * page_size for n in num_tokens_per_request)
    return int(reserved - sum(num_tokens_per_request))


def contiguous_waste(num_tokens_per_request, max_len):
    return sum(max_len - n for n in num_tokens_per_request)
'''

KERNEL_LOOP = '''    for first in range(0, seq_len, BLOCK_N):
        pos = first + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        page_ids = tl.load(block_table + pos // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
        where = page_ids * stride_page + (pos % PAGE_SIZE) * stride_row
        ptrs = where[:, None] + kv_base[None, :]
        load_mask = valid[:, None] & dim_ok[None, :]
        keys = tl.load(k_cache_ptr + ptrs, mask=load_mask, other=0.0).to(tl.float32)
        vals = tl.load(v_cache_ptr + ptrs, mask=load_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        new_m = tl.maximum(m, tl.max(s, axis=1))
        correction = tl.exp(m - new_m)
        w = tl.exp(s - new_m[:, None])
        l = correction * l + tl.sum(w, axis=1)
        acc = correction[:, None] * acc + tl.sum(w[:, :, None] * vals[None, :, :], axis=1)
        m = new_m
'''
STUB = "    # YOUR CODE HERE\n    raise NotImplementedError()\n"


def trimmed(assignment: str):
    """The course's solution notebook of `assignment` with only the cells its exercise needs."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    keep = []
    for cell in nb.cells:
        text = cell.get("source", "") if cell.get("cell_type") == "code" else ""
        if G.grade_id(cell) in GRADED[assignment] or any(needle in text for needle in NEEDS[assignment]):
            keep.append(cell)
    nb.cells = [new_code_cell("from course_lib.course import checking")] + keep
    return nb


def _source(builder, assignment: str):
    """The trimmed source, written once into the batch's source folder (the cases share it)."""
    path = builder.source_dir / assignment / f"{assignment}.ipynb"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(trimmed(assignment), path)
    return nbformat.read(path, as_version=4)


def _submission(builder, which, answers: dict[str, str]):
    source = _source(builder, which[0])
    nb = released_submission(source)  # the notebook as handed out: given code, stubs, no hidden tests
    for grade_id, code in answers.items():
        nb = with_answer(nb, grade_id, code)
    return nb


def _honest_launcher(builder):
    """The given launcher untouched, the kernel's loop written in (the rest of the cell as given)."""
    released = released_submission(_source(builder, LAUNCHER[0]))
    given = next(c.source for c in released.cells if G.grade_id(c) == LAUNCHER[1])
    assert STUB in given, "the released kernel cell has no stub to fill in"
    return with_answer(released, LAUNCHER[1], given.replace(STUB, KERNEL_LOOP))


def _clean(student):
    def expect(graded):
        entry = graded.by[student]
        assert not entry["flags"], f"an honest notebook was flagged: {entry['flags']}"
        assert not entry.get("copies"), entry.get("copies")
        assert not entry["integrity"], entry["integrity"]
    return expect


def _flagged_admit(graded):
    entry = graded.by["accusation_pasted_admit"]
    want = "course_lib.scheduler.base.SchedulerBase._admit"
    assert any("StudentScheduler._admit" in f and want in f for f in entry["flags"]), entry["flags"]
    copies = [c for c in entry.get("copies", []) if c["matched"] == want]
    assert copies, entry.get("copies")
    for c in copies:
        assert "def _admit" in c["student_code"] and "def _admit" in c["matched_code"], c
        assert "self._admit_counter += 1" in c["student_code"] and "self._admit_counter += 1" in c["matched_code"]
    # nothing inherited (SchedulerBase's other methods) is reported as the student's
    assert not any("SchedulerBase." in f and "StudentScheduler" not in f for f in entry["flags"]), entry["flags"]


CASES = [
    AttackCase("accusation_inherits_scheduler_base", lambda b: [b.write(
        "accusation_inherits_scheduler_base", _submission(b, SCHEDULER, {SCHEDULER[1]: HONEST_SCHEDULER}),
        SCHEDULER)], _clean("accusation_inherits_scheduler_base"), honest=True),
    AttackCase("accusation_recompute_as_hinted", lambda b: [b.write(
        "accusation_recompute_as_hinted", _submission(b, RECOMPUTE, {RECOMPUTE[1]: HONEST_RECOMPUTE}),
        RECOMPUTE)], _clean("accusation_recompute_as_hinted"), honest=True),
    AttackCase("accusation_short_functions", lambda b: [b.write(
        "accusation_short_functions", _submission(b, SLOTS, {"slot_mapping": HONEST_SLOTS, "kv_waste": HONEST_WASTE}),
        SLOTS)], _clean("accusation_short_functions"), honest=True),
    AttackCase("accusation_given_launcher", lambda b: [b.write(
        "accusation_given_launcher", _honest_launcher(b), LAUNCHER)], _clean("accusation_given_launcher"), honest=True),
    AttackCase("accusation_pasted_admit", lambda b: [b.write(
        "accusation_pasted_admit", _submission(b, SCHEDULER, {SCHEDULER[1]: PASTED_ADMIT}),
        SCHEDULER)], _flagged_admit),
]
