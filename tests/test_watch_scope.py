"""What the trip wires spare, and what they still refuse (docs/grading.md, "What the trip wires watch").

A check watches course_lib's module of its exercise: a student function that calls into it is refused as
"calls the reference". Some of those modules also hold a helper the notebook hands the student, which
computes no part of the exercise's answer; watching it refused honest answers. Each narrowed watch spares
such a helper (`forbid_calls(..., allowed=...)`, `watch_calls(..., allowed=...)`):

- notebook 1's static loops may call course_lib's `pad_batch` (section 2's exercise, graded by its own
  check; later cells hand it over as `pad_fn` while the student's fails);
- notebook 3's `build_flat_batch` may use `FlatBatch` (the class its answer must be), `num_tokens` included;
- notebook 4's Triton wrapper may ask triton_decode's small helpers, `check_inputs` among them.

Each case runs as the grader grades it: the check call recorded through the membrane, as the sandbox records
it, then replayed against the grader's own check (the machinery of tests/test_exercise_roundtrip.py). For
each, an answer that calls the spared helper passes both, and one that calls the counterpart, or another
piece of the module that computes the answer, is refused in both. The first tests hold the trip wires'
`allowed` itself: a spared function notes nothing, its copies and the rest of its module still do.
"""
from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from check_support import record_check_call, student_copy_fixture

from autograder._checking import REFERENCE_MESSAGE
from autograder.call_tripwire import tripwires
from autograder.checks import get_check
from autograder.replay import replay

student_copy = student_copy_fixture("scope")


@pytest.fixture(scope="module")
def student_module(tmp_path_factory):
    """`student_module(name, source)`: `source` imported from a file outside the autograder, as a student's
    module (its functions are the student's code)."""
    folder = tmp_path_factory.mktemp("students")
    made = []

    def load(name, source):
        path = folder / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        made.append(name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """`graded(exercise, impl, label)`: (the kernel's outcome: None if the check passed, else its message;
    the grader's replay of the record: (ok, message)) for one check call on the visible seed."""
    folder = tmp_path_factory.mktemp("records")

    def run(adapter, impl, label):
        entry, outcome = record_check_call(folder / f"{adapter}-{label}.jsonl", adapter, impl)
        return outcome, replay(get_check(adapter), entry)

    return run


def _passes(result):
    outcome, replayed = result
    assert outcome is None, f"refused in the kernel: {outcome}"
    assert replayed == (True, ""), f"passes in the kernel but not on the grader's replay: {replayed}"


def _refused(result, calls: str):
    outcome, (ok, message) = result
    assert outcome is not None and REFERENCE_MESSAGE in outcome and calls in outcome, outcome
    assert not ok and message == f"AssertionError: {outcome}", message


# -- the trip wires' `allowed` ------------------------------------------------------------------------------

_HELPERS = '''
def helper(x):
    return x + 1


def answer(x):
    return helper(x) * 2


def reference(x):
    return x * 3


class Box:
    @property
    def size(self):
        return 3
'''


@pytest.fixture(scope="module")
def watched(student_module):
    return student_module("scope_watched_module", _HELPERS)


MODULE = "scope_watched_module"
HELPER, BOX = f"{MODULE}:helper", f"{MODULE}:Box"


def test_an_allowed_function_notes_nothing_and_the_rest_of_its_module_still_does(watched):
    with tripwires([watched], [], allowed=(HELPER, BOX)) as hits:
        watched.helper(1)
        assert watched.Box().size == 3
    assert hits == []
    with tripwires([watched], [], allowed=(HELPER,)) as hits:
        watched.answer(1)  # (it calls helper: spared, not noted)
        assert watched.Box().size == 3
    assert hits == [(MODULE, "answer"), (MODULE, "size")]


def test_a_copy_of_an_allowed_function_is_spared_and_a_relabelled_copy_of_another_is_not(watched):
    with tripwires([watched], []):  # (the audit hook is installed by the first block: it sees the copies made)
        pass
    same = types.FunctionType(watched.helper.__code__, watched.helper.__globals__, "helper_copy")
    code = watched.answer.__code__.replace(co_name="helper", co_qualname="helper")
    relabelled = types.FunctionType(code, watched.answer.__globals__, "helper")
    # The helper's own bytecode with other constants (`code.replace(co_consts=...)`): `x + 1` becomes `x + 41`.
    helper_code = watched.helper.__code__
    consts = tuple(41 if c == 1 else c for c in helper_code.co_consts)
    other_consts = types.FunctionType(helper_code.replace(co_consts=consts), watched.__dict__)
    with tripwires([watched], [], allowed=(HELPER,)) as hits:
        same(1)  # the helper's own code: it computes nothing of the answer, wherever it is reached from
        relabelled(1)  # the answer's bytecode under the helper's name
        assert other_consts(1) == 42
    assert hits == [(MODULE, "helper")] * 2  # (the copies, named by their code's name)


def test_what_is_spared_is_judged_by_its_code_not_by_where_it_is_found(watched, monkeypatch):
    """A name the block allows, rebound to another function of the module (the module's attribute, or a
    member slipped into an allowed class), spares nothing: the function is noted under its own name."""
    monkeypatch.setattr(watched, "helper", watched.reference)
    monkeypatch.setattr(watched.Box, "extra", staticmethod(watched.reference), raising=False)
    with tripwires([watched], [], allowed=(HELPER, BOX)) as hits:
        watched.helper(1)
        watched.Box.extra(1)
    assert hits == [(MODULE, "reference")] * 2


def test_a_block_that_allows_nothing_still_notes_what_an_inner_block_allows(watched):
    with tripwires([watched], []) as outer:
        with tripwires([watched], [], allowed=(HELPER,)) as inner:
            watched.helper(1)
    assert inner == [] and outer == [(MODULE, "helper")]


# -- notebook 1: the static loops may call course_lib's pad_batch -------------------------------------------

@pytest.mark.parametrize("adapter", ["static_generate", "static_generate_cached"])
def test_a_static_loop_may_call_course_libs_pad_batch(adapter, student_copy, graded, monkeypatch):
    """The student's pad_batch failed its check, and their loop pads with course_lib's (the notebook's
    `pad_fn`, or `static_batching.pad_batch`): the loop is theirs and gets its marks."""
    import course_lib.static_batching as static_batching

    solution = student_copy("reference", "nb01_static_batching")
    monkeypatch.setattr(solution, "pad_batch", static_batching.pad_batch)
    _passes(graded(adapter, getattr(solution, adapter), "fallback_pad_batch"))


@pytest.mark.parametrize("adapter, other", [("static_generate", "static_generate_cached"),
                                            ("static_generate_cached", "static_generate")])
def test_a_static_loop_that_runs_course_libs_loop_is_still_refused(adapter, other, graded):
    import course_lib.static_batching as static_batching

    counterpart, sibling = getattr(static_batching, adapter), getattr(static_batching, other)

    def wrapper(model, prompts, max_tokens, eos_id):
        return counterpart(model, prompts, max_tokens, eos_id)

    def through_the_other_loop(model, prompts, max_tokens, eos_id):
        return sibling(model, prompts, max_tokens, eos_id)

    _refused(graded(adapter, wrapper, "wrapper"), f"course_lib.static_batching.{adapter}")
    _refused(graded(adapter, through_the_other_loop, "other_loop"), f"course_lib.static_batching.{other}")


@pytest.mark.parametrize("adapter", ["static_generate", "static_generate_cached"])
def test_a_static_loop_reached_through_pad_batchs_name_is_still_refused(adapter, graded, monkeypatch):
    """The spared name rebound to the counterpart (`static_batching.pad_batch = static_batching.<loop>`
    before the check): the function is judged by its own code, so the loop is refused."""
    import course_lib.static_batching as static_batching

    monkeypatch.setattr(static_batching, "pad_batch", getattr(static_batching, adapter))

    def through_pad_batchs_name(model, prompts, max_tokens, eos_id):
        return static_batching.pad_batch(model, prompts, max_tokens, eos_id)

    _refused(graded(adapter, through_pad_batchs_name, "renamed"), f"course_lib.static_batching.{adapter}")


# -- notebook 3: build_flat_batch may use FlatBatch ---------------------------------------------------------

_SIZED_BUILDER = '''

def build_flat_batch_sized(output, page_size, device="cpu", pad_slot=0):
    batch = build_flat_batch(output, page_size, device, pad_slot)
    if batch.num_tokens != len(batch.positions):  # FlatBatch's own property, read by an honest builder
        raise AssertionError("num_tokens disagrees with the rows")
    return batch
'''


def test_build_flat_batch_may_use_flat_batch_and_its_num_tokens(student_module, graded):
    from autograder import reference

    with open(reference.__path__[0] + "/nb03_paged_kv.py") as f:
        source = f.read()
    solution = student_module("scope_flat_batch", source + _SIZED_BUILDER)
    _passes(graded("build_flat_batch", solution.build_flat_batch_sized, "num_tokens"))


def test_build_flat_batch_with_course_libs_builder_or_slot_map_is_still_refused(student_copy, graded, monkeypatch):
    """The slot formula stays watched: it is part of this answer (the notebook says to use your own
    slot_mapping of section 2)."""
    from course_lib.kv.slots import slot_mapping
    from course_lib.runner_batch import build_flat_batch

    def wrapper(output, page_size, device="cpu", pad_slot=0):
        return build_flat_batch(output, page_size, device, pad_slot)

    _refused(graded("build_flat_batch", wrapper, "wrapper"), "course_lib.runner_batch.build_flat_batch")
    solution = student_copy("reference", "nb03_paged_kv")
    monkeypatch.setattr(solution, "slot_mapping", slot_mapping)
    _refused(graded("build_flat_batch", solution.build_flat_batch, "course_lib_slots"),
             "course_lib.kv.slots.slot_mapping")


# -- notebook 4: the Triton wrapper may validate its inputs with triton_decode's check_inputs ---------------

_VALIDATED_WRAPPER = '''

from course_lib.attention.triton_decode import check_inputs


def paged_attention_triton_validated(q, k_cache, v_cache, block_tables, seq_lens, scale):
    check_inputs(q, k_cache, v_cache, block_tables, seq_lens)  # triton_decode's validation, not its attention
    return paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale)
'''


def test_the_triton_wrapper_may_call_check_inputs(student_module, graded):
    from autograder import reference

    with open(reference.__path__[0] + "/nb04_paged_attention.py") as f:
        source = f.read()
    solution = student_module("scope_triton", source + _VALIDATED_WRAPPER)
    _passes(graded("paged_attention_triton", solution.paged_attention_triton_validated, "check_inputs"))


def test_the_triton_wrapper_that_runs_course_libs_kernel_is_still_refused(graded):
    from course_lib.attention.triton_decode import paged_decode_triton

    def wrapper(q, k_cache, v_cache, block_tables, seq_lens, scale):
        return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale)

    _refused(graded("paged_attention_triton", wrapper, "wrapper"), "course_lib.attention.triton_decode")
