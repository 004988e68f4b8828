"""A copy flag accuses only code the student wrote (autograder/fingerprint.py), kernel-free.

Not inherited (a subclass of SchedulerBase, as notebooks 2 and 7 ask), not given (notebook 4's
launcher), not a short function two honest students write alike (the honest variants below are
also the measurement behind MIN_NODES and MIN_NODES_ASKED); and a real copy is still flagged,
with both pieces of code side by side.
"""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder import fingerprint as F
from autograder.submissions import released_submission
from course_lib import static_batching
from course_lib.scheduler.base import SchedulerBase
from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput
from course_lib.scheduler.request import Request, RequestStatus

from attack_cases.accusation import HONEST_RECOMPUTE, HONEST_SCHEDULER, KERNEL_LOOP, PASTED_ADMIT, STUB

ROOT = Path(__file__).resolve().parents[1]
ADMIT = "course_lib.scheduler.base.SchedulerBase._admit"


def given(assignment: str) -> F.Given:
    return F.given_by(nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4))


def define(cell: str, name: str):
    """What a notebook cell defines, run as the kernel runs it."""
    namespace = {"SchedulerBase": SchedulerBase, "ContinuousScheduler": ContinuousScheduler,
                 "SchedulerOutput": SchedulerOutput, "ScheduledRequest": ScheduledRequest,
                 "Request": Request, "RequestStatus": RequestStatus, "entry": lambda request, n: None}
    exec(compile(cell, "<ipython-input-7>", "exec"), namespace)
    return namespace[name]


def records(exercise: str, adapter) -> list[dict]:
    """What the sandbox sends back for three seeds of a check on `adapter`."""
    return [{"exercise": exercise, "seed": seed, "code": F.code_fingerprints(adapter)} for seed in (0, 1, 2)]


# ---------------------------------------------------------------------------------------------
# Inherited is not written
# ---------------------------------------------------------------------------------------------


def test_inherited_methods_are_not_the_students():
    scheduler = define(HONEST_SCHEDULER, "StudentScheduler")
    names = [name for name, _ in F.code_fingerprints(scheduler)]
    assert names and all(name.startswith("StudentScheduler.") for name in names), names
    cells = [(6, HONEST_SCHEDULER)]
    assert F.code_copies(records("StudentScheduler", scheduler), cells, given("02_continuous_batching")) == []
    assert F.source_copies(cells, given("02_continuous_batching")) == []


def test_a_subclass_of_the_counterpart_with_the_hinted_preempt_is_not_flagged():
    """Notebook 7: `preempt` as hint 2 spells it is course_lib's own; everything else is inherited."""
    recompute = define(HONEST_RECOMPUTE, "StudentRecompute")
    cells = [(11, HONEST_RECOMPUTE)]
    assert F.code_copies(records("StudentRecompute", recompute), cells, given("07_admission_control")) == []
    assert F.source_copies(cells, given("07_admission_control")) == []


def test_a_method_handed_over_from_course_lib_is_not_the_students():
    cell = "class Borrowing(SchedulerBase):\n    _admit = SchedulerBase._admit\n    abort = SchedulerBase.abort\n"
    assert F.code_fingerprints(define(cell, "Borrowing")) == []


# ---------------------------------------------------------------------------------------------
# Written is a copy, however it got there
# ---------------------------------------------------------------------------------------------


def test_a_method_pasted_into_the_class_is_flagged_with_the_evidence_side_by_side():
    scheduler = define(PASTED_ADMIT, "StudentScheduler")
    cells = [(6, PASTED_ADMIT)]
    found = F.code_copies(records("StudentScheduler", scheduler), cells, given("02_continuous_batching"))
    assert [c.flag for c in found] == [
        f"check_StudentScheduler(seed=0, 1, 2): StudentScheduler._admit runs the same bytecode as {ADMIT}"]
    evidence = found[0].evidence()
    assert set(evidence) == {"where", "student_code", "matched", "matched_code"}
    assert evidence["matched"] == ADMIT
    assert evidence["student_code"].startswith("def _admit(self, request: Request")  # the student's text
    assert "self._admit_counter += 1" in evidence["student_code"]
    assert evidence["matched_code"] == textwrap.dedent(inspect.getsource(SchedulerBase._admit))
    by_source = F.source_copies(cells, given("02_continuous_batching"))
    assert [c.evidence()["matched"] for c in by_source] == [ADMIT], [c.flag for c in by_source]
    assert by_source[0].where == "cell 6: StudentScheduler._admit"


def test_a_copy_dressed_as_course_libs_own_is_still_a_copy():
    """Compiled under course_lib's file name, with its module and qualified name: a new code object."""
    source = textwrap.dedent(inspect.getsource(SchedulerBase._admit))
    namespace = {"Request": Request, "RequestStatus": RequestStatus}
    exec(compile(source, inspect.getsourcefile(SchedulerBase), "exec"), namespace)
    forged = namespace["_admit"]
    forged.__module__, forged.__qualname__ = SchedulerBase.__module__, "SchedulerBase._admit"
    klass = type("StudentScheduler", (SchedulerBase,), {"_admit": forged})
    found = F.code_copies(records("StudentScheduler", klass), [], given("02_continuous_batching"))
    assert [c.evidence()["matched"] for c in found] == [ADMIT]
    assert "built at run time" in found[0].student_code


def test_the_answer_key_and_course_lib_copies_of_an_exercise_are_flagged():
    key = (ROOT / "autograder" / "reference" / "nb03_paged_kv.py").read_text(encoding="utf-8")
    pasted = "\n\n".join(f.source for f in F.functions_in(key, "") if f.name == "build_flat_batch")
    found = F.source_copies([(12, pasted)], given("03_paged_kv"))
    assert [c.evidence()["matched"] for c in found] == ["answer key"], [c.flag for c in found]
    # course_lib's pad_batch exec'd under another name (test_grade_attacks' COPIES, without a kernel)
    namespace = {"torch": static_batching.torch}
    exec(compile(inspect.getsource(static_batching.pad_batch), "mine.py", "exec"), namespace)
    found = F.code_copies(records("pad_batch", namespace["pad_batch"]), [], given("01_static_batching"))
    assert [c.evidence()["matched"] for c in found] == ["course_lib.static_batching.pad_batch"]


# ---------------------------------------------------------------------------------------------
# Given is not written
# ---------------------------------------------------------------------------------------------


def _launcher_cell() -> str:
    source = nbformat.read(ROOT / "solutions" / "04_paged_attention" / "04_paged_attention.ipynb", as_version=4)
    released = released_submission(source)
    text = next(c.source for c in released.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                == "paged_attention_triton")
    assert STUB in text
    return text.replace(STUB, KERNEL_LOOP)


def test_the_launcher_the_notebook_gives_is_not_a_copy():
    cell = _launcher_cell()
    launcher = next(f for f in F.functions_in(cell, "") if f.name == "paged_attention_triton")
    recorded = [{"exercise": "paged_attention_triton", "seed": 0,
                 "code": [["paged_attention_triton", launcher.code_hash]]}]
    notebook = given("04_paged_attention")
    assert F.source_copies([(14, cell)], notebook) == []
    assert F.code_copies(recorded, [(14, cell)], notebook) == []
    # ... while the same code, had the notebook not given it, would match the answer key
    bare = F.Given(asked=notebook.asked)
    assert [c.evidence()["matched"] for c in F.source_copies([(14, cell)], bare)] == ["answer key"]
    assert [c.evidence()["matched"] for c in F.code_copies(recorded, [(14, cell)], bare)] == ["answer key"]


def test_what_the_notebook_asks_for_is_read_from_its_answer_cells():
    assert {"slot_mapping", "paged_waste", "allocate", "share"} <= given("03_paged_kv").asked
    assert {"choose_victim", "preempt", "can_admit"} <= given("07_admission_control").asked
    assert "paged_attention_triton" not in given("04_paged_attention").asked  # given, not asked
    assert "require_finished" not in given("04_paged_attention").asked


# ---------------------------------------------------------------------------------------------
# Short functions: what honest students write alike (the measurement behind the two sizes)
# ---------------------------------------------------------------------------------------------

# Written from each notebook's goal, rules and hints, as different students would. Some coincide
# with course_lib, the answer key or a control (their "matches" below): that is the measurement.
HONEST = {
    "03_paged_kv": [
        ("slot_mapping", "reference", '''def slot_mapping(block_table, page_size, start, count):
    slots = []
    for pos in range(start, start + count):
        page = block_table[pos // page_size]
        slots.append(page * page_size + pos % page_size)
    return slots
'''),
        ("slot_mapping", "control", '''def slot_mapping(block_table, page_size, start, count):
    slots = []
    for pos in range(start, start + count):
        page, row = divmod(pos, page_size)
        slots.append(block_table[page] * page_size + row)
    return slots
'''),
        ("slot_mapping", "course_lib", '''def slot_mapping(block_table, page_size, start, count):
    return [block_table[p // page_size] * page_size + p % page_size for p in range(start, start + count)]
'''),
        ("slot_mapping", None, '''def slot_mapping(block_table, page_size, start, count):
    result = []
    for pos in range(start, start + count):
        page_idx = pos // page_size
        offset = pos % page_size
        result.append(block_table[page_idx] * page_size + offset)
    return result
'''),
        ("paged_waste", "control", '''def paged_waste(num_tokens_per_request, page_size):
    reserved = sum(math.ceil(n / page_size) * page_size for n in num_tokens_per_request)
    return int(reserved - sum(num_tokens_per_request))
'''),
        ("paged_waste", "course_lib", '''def paged_waste(num_tokens_per_request, page_size):
    return sum(-(-n // page_size) * page_size - n for n in num_tokens_per_request)
'''),
        ("paged_waste", None, '''def paged_waste(num_tokens_per_request, page_size):
    waste = 0
    for n in num_tokens_per_request:
        pages = (n + page_size - 1) // page_size
        waste += pages * page_size - n
    return waste
'''),
        ("contiguous_waste", "course_lib", '''def contiguous_waste(num_tokens_per_request, max_len):
    return sum(max_len - n for n in num_tokens_per_request)
'''),
        ("contiguous_waste", "control", '''def contiguous_waste(num_tokens_per_request, max_len):
    return len(num_tokens_per_request) * max_len - sum(num_tokens_per_request)
'''),
    ],
    "07_admission_control": [
        ("preempt", "course_lib", '''def preempt(self, request):
    self.running.remove(request)
    self.kv.free(request)
    request.num_computed_tokens = 0
    request.status = RequestStatus.PREEMPTED
    self.waiting.appendleft(request)
'''),
        ("choose_victim", "course_lib", '''def choose_victim(self):
    return self.preemptible[-1]
'''),
        ("can_admit", "course_lib", '''def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
    need = kv.num_pages_needed(request, num_new_tokens, cached_pages)
    return kv.num_free_pages - need >= self.watermark * kv.num_pages
'''),
    ],
    "02_continuous_batching": [
        ("finish", "course_lib", '''def finish(self, request):
    self.running.remove(request)
    self.kv.free(request)
    return [request]
'''),
        # a helper nobody asked for, written from hint 2's rule: course_lib's own _chunk
        ("_chunk", "course_lib", '''def _chunk(self, pending, budget):
    if self.enable_chunked_prefill:
        return min(pending, budget)
    if pending <= budget or budget == self.max_num_batched_tokens:
        return pending
    return 0
'''),
    ],
    "06_prefix_caching": [
        # hint 2 ("carry one running value through a loop over the full pages") the answer key's way
        ("page_keys", "reference", '''def page_keys(token_ids, page_size):
    keys, previous = [], 0
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        previous = hash((previous, tuple(token_ids[start:start + page_size])))
        keys.append(previous)
    return keys
'''),
    ],
}
MARGIN = 1.3  # each size stays this far above every coincidence measured


@pytest.mark.parametrize("assignment", sorted(HONEST))
def test_short_functions_honest_students_write_alike_are_not_flagged(assignment):
    notebook = given(assignment)
    table = F.known()
    for name, matches, code in HONEST[assignment]:
        (function,) = F.functions_in(code, "cell 3: ")
        assert F.source_copies([(3, code)], notebook) == [], code
        recorded = [{"exercise": name, "seed": 0, "code": [[name, function.code_hash]]}]
        assert F.code_copies(recorded, [(3, code)], notebook) == [], code
        match = table.by_source.get(function.source_hash)
        assert (match is not None) == (matches is not None), (code, match)
        if match is not None:  # a coincidence: the size that lets it through keeps its margin
            kind = {"course_lib": "course_lib.", "reference": "autograder.reference.",
                    "control": "autograder.controls."}[matches]
            assert match.where.startswith(kind), match.where
            assert match.nodes * MARGIN <= notebook.min_nodes(name), (match.where, match.nodes)


def test_a_pasted_method_nobody_asked_for_is_big_enough_to_count():
    admit = next(f for f in F.known().by_source.values() if f.where == ADMIT)
    notebook = given("02_continuous_batching")
    assert "_admit" not in notebook.asked
    assert admit.nodes >= notebook.min_nodes("_admit") > max(
        F.functions_in(code, "")[0].nodes for name, matches, code in HONEST["02_continuous_batching"])
