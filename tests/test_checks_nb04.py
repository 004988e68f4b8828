"""Notebook 04's checks (paged attention: loops, vectorised, a Triton kernel): course_lib's backends pass
(seed 3), each rule has its own message, NaN/inf sit in every
unowned slot (that the generated reference passes and every mutant fails and every control passes on every graded seed is tested for all
notebooks in tests/test_exercise_table.py). Without a GPU the Triton kernels run
in Triton's interpreter (conftest sets TRITON_INTERPRET=1 before anything imports triton). Run times are
printed (no timed assertion: speed is not a test)."""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autograder.checks import get_check  # noqa: E402
from autograder.checks import nb04_paged_attention as checks  # noqa: E402
from autograder.checks.nb04_paged_attention import _shared as inputs  # noqa: E402
from autograder.checks.nb04_paged_attention import paged_attention_triton as triton_check  # noqa: E402
from autograder.exercises import of_module  # noqa: E402
from autograder.mutants import nb04_paged_attention as mutants  # noqa: E402
from autograder.reference import nb04_paged_attention as reference  # noqa: E402
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb04_paged_attention")}


def test_course_lib_backends_pass():
    from course_lib.attention.reference import paged_decode_reference
    from course_lib.attention.torch_paged import paged_decode_torch
    from course_lib.attention.triton_decode import paged_decode_triton

    for exercise, impl in (("paged_attention_loops", paged_decode_reference),
                           ("paged_attention_vectorized", paged_decode_torch),
                           ("paged_attention_triton", paged_decode_triton)):
        assert verdict(exercise, impl, 3) is None


def test_every_unowned_slot_holds_nan_or_inf():
    """The rule 'garbage may be nan or inf' is only enforced if every unowned slot really is."""
    q, k, v, bt, lens, scale = inputs._case(random.Random(0), 4, 2, 8, 4, [1, 4, 7])
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
        mutants.loops_in_bfloat16: 'Rule "float32 or wider"',
        mutants.vectorized_in_bfloat16: 'Rule "float32 or wider"',
        mutants.vectorized_loops_over_pages: 'Rule "no loop over pages"',
        mutants.triton_unmasked_table_load: 'Rule "table entries of tokens only"',
    }
    if checks.triton_device() == "cpu":  # the bfloat16 case runs in the interpreter only
        hints[mutants.triton_in_bfloat16] = 'Rule "float32 or wider"'
    for mutant, expected in hints.items():
        exercise = next(e for e, ms in mutants.MUTANTS.items() if mutant in ms)
        message = verdict(exercise, mutant, 0)
        assert expected in message, f"{mutant.__name__}: {message}"


@pytest.mark.skipif(checks.triton_device() != "cpu", reason="the arithmetic is watched in Triton's interpreter only")
def test_bfloat16_arithmetic_is_noted_and_a_float32_accumulating_dot_is_not():
    """The interpreter keeps bfloat16 as raw bits, so its bfloat16 case reads which operations ran on 16-bit
    floats, not the answer: the mutant's products and sums in bfloat16 are noted; the reference (float32 once
    loaded) and course_lib's kernel (bfloat16 operands into a float32 `tl.dot` accumulator, FlashAttention's
    trade) have none."""
    from course_lib.attention.triton_decode import paged_decode_triton

    _, case = triton_check._triton_bf16_case(0)
    with triton_check._float16_arithmetic() as ops:
        mutants.triton_in_bfloat16(*case)
    assert {("multiply", "bf16"), ("sum", "bf16")} <= set(ops), ops
    for impl in (reference.paged_attention_triton, paged_decode_triton):
        with triton_check._float16_arithmetic() as ops:
            impl(*case)
        assert ops == [], (impl.__name__, ops)


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
