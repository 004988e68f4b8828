"""Notebook 04's checks (paged attention: loops, vectorised, a Triton kernel): the generated reference,
course_lib's backends and every control pass on every graded seed; every mutant fails on every graded
seed with a message that names the input, the expected and the got. Without a GPU the Triton kernels run
in Triton's interpreter (conftest sets TRITON_INTERPRET=1 before anything imports triton). Run times are
printed (no timed assertion: speed is not a test)."""
from __future__ import annotations

import os
import random
import time

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autograder.checks import get_check  # noqa: E402
from autograder.checks import nb04_paged_attention as checks  # noqa: E402
from autograder.controls import nb04_paged_attention as controls  # noqa: E402
from autograder.exercises import of_module  # noqa: E402
from autograder.mutants import nb04_paged_attention as mutants  # noqa: E402
from autograder.reference import nb04_paged_attention as reference  # noqa: E402

EXERCISES = {e.adapter: e for e in of_module("nb04_paged_attention")}


def _verdict(exercise, impl, seed):
    start = time.perf_counter()
    try:
        get_check(exercise)(impl, seed, _allow_reference=True)
        message = None
    except AssertionError as e:
        message = str(e)
    print(f"check_{exercise}({getattr(impl, '__name__', impl)}, seed={seed}): {time.perf_counter() - start:.2f} s")
    return message


def _cases(table):
    return [(ex, impl) for ex in EXERCISES for impl in table[ex]]


def test_every_exercise_has_mutants_and_controls():
    assert set(EXERCISES) == {"paged_attention_loops", "paged_attention_vectorized", "paged_attention_triton"}
    for exercise in EXERCISES:
        assert len(mutants.MUTANTS[exercise]) >= 3, exercise
        assert len(controls.CONTROLS[exercise]) >= 1, exercise


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_passes_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert _verdict(exercise, getattr(reference, exercise), seed) is None


def test_course_lib_backends_pass():
    from course_lib.attention.reference import paged_decode_reference
    from course_lib.attention.torch_paged import paged_decode_torch
    from course_lib.attention.triton_decode import paged_decode_triton

    for exercise, impl in (("paged_attention_loops", paged_decode_reference),
                           ("paged_attention_vectorized", paged_decode_torch),
                           ("paged_attention_triton", paged_decode_triton)):
        assert _verdict(exercise, impl, 3) is None


@pytest.mark.parametrize("exercise, control", _cases(controls.CONTROLS),
                         ids=[f"{e}-{c.__name__}" for e, c in _cases(controls.CONTROLS)])
def test_every_control_passes_every_graded_seed(exercise, control):
    for seed in EXERCISES[exercise].graded_seeds:
        message = _verdict(exercise, control, seed)
        assert message is None, f"{control.__name__} (correct: {control.__doc__}) failed on seed {seed}: {message}"


@pytest.mark.parametrize("exercise, mutant", _cases(mutants.MUTANTS),
                         ids=[f"{e}-{m.__name__}" for e, m in _cases(mutants.MUTANTS)])
def test_every_mutant_fails_every_graded_seed(exercise, mutant):
    for seed in EXERCISES[exercise].graded_seeds:
        message = _verdict(exercise, mutant, seed)
        assert message, f"{mutant.__name__} ({mutant.__doc__}) passed check_{exercise} on seed {seed}"
        assert len(message) > 40, f"unhelpful message: {message!r}"
        assert exercise in message, f"the message should name the exercise: {message!r}"


def test_every_unowned_slot_holds_nan_or_inf():
    """The rule 'garbage may be nan or inf' is only enforced if every unowned slot really is."""
    q, k, v, bt, lens, scale = checks._case(random.Random(0), 4, 2, 8, 4, [1, 4, 7])
    owned = torch.zeros(k.shape[:2], dtype=torch.bool)
    for s, n in enumerate(lens.tolist()):
        for t in range(n):
            owned[bt[s, t // 4], t % 4] = True
    for cache in (k, v):
        assert torch.isfinite(cache[owned]).all()
        assert not torch.isfinite(cache[~owned]).any()
    assert not torch.isfinite(k[-1]).any(), "the pool's last page is never owned"


def test_messages_name_the_broken_rule():
    hints = {
        mutants.vectorized_masks_scores_not_values: "a zero weight times a NaN",
        mutants.loops_recomputes_scale: "instead of the scale argument",
        mutants.triton_no_rescale: "running max rises",
        mutants.triton_torch_wrapper: "no Triton kernel was launched",
        mutants.loops_no_max_trick: "OverflowError",
    }
    for mutant, expected in hints.items():
        exercise = next(e for e, ms in mutants.MUTANTS.items() if mutant in ms)
        message = _verdict(exercise, mutant, 0)
        assert expected in message, f"{mutant.__name__}: {message}"


def test_the_unfinished_kernel_raises_not_implemented():
    """The student's kernel still holds nbgrader's placeholder: the given wrapper says so plainly."""
    kernel_source = "def paged_decode_kernel():\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    namespace = {}
    exec(compile(kernel_source, "<student cell>", "exec"), namespace)
    with pytest.raises(NotImplementedError):
        reference.require_finished(_Placeholder(namespace["paged_decode_kernel"], kernel_source))


class _Placeholder:
    """Stands for a jitted kernel (`.fn` is its Python function), its source registered in linecache
    the way IPython registers a notebook cell's."""

    def __init__(self, fn, src):
        import linecache

        linecache.cache["<student cell>"] = (len(src), None, src.splitlines(True), "<student cell>")
        self.fn = fn


def test_handing_in_course_lib_is_refused():
    from course_lib.attention import paged_decode
    from course_lib.attention.triton_decode import paged_decode_triton

    with pytest.raises(AssertionError, match="course_lib's reference"):
        get_check("paged_attention_triton")(paged_decode_triton)

    def wrapper(q, k, v, bt, lens, scale):  # defined here: only the call reveals it
        return paged_decode(q, k, v, bt, lens, scale, backend="triton")

    with pytest.raises(AssertionError, match="course_lib's reference"):
        get_check("paged_attention_triton")(wrapper)


def test_the_given_wrapper_may_ask_whether_triton_interprets():
    """The notebook's launch wrapper calls triton_decode.interpreting(): that is not using the reference
    (checked without _allow_reference, as a student's notebook runs it; the answer key itself is only
    refused by where it lives, so a copy of it is made to look like a notebook cell's)."""
    import inspect
    import linecache

    source = inspect.getsource(reference)
    filename = "<notebook cell: the reference kernel, pasted>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    assert get_check("paged_attention_triton")(namespace["paged_attention_triton"], 0) is None
