"""Notebook 04, `paged_attention_triton`: the student's kernel in Triton's interpreter (or on a GPU),
scores growing across blocks, and the dtype of every rounding operation on bfloat16 inputs."""
from __future__ import annotations

import contextlib
import os
import random

import torch

from autograder import _checking
from autograder._checking import REFERENCE_MESSAGE, broke, call, check, expect, fail, is_tensor, kind_of, watch_calls

from ._shared import _case, _compare, _describe, _reference_modules


def triton_device() -> str:
    """Where Triton kernels run in this process: "cpu" under TRITON_INTERPRET=1, else "cuda"."""
    interpret = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
    return "cpu" if interpret or not torch.cuda.is_available() else "cuda"


def _triton_cases(seed: int):
    """Small float32 shapes (the interpreter runs every operation in Python). BLOCK_N is 16 in the
    notebook's wrapper under the interpreter: 20-40 tokens span two or three blocks."""
    rng = random.Random(seed)
    f32 = torch.float32
    return [
        ("GQA (4 query heads, 2 KV heads, head_dim 16), pages of 4; seq_len 1, exactly full pages, a partial "
         "last page", _case(rng, 4, 2, 16, 4, [1, 8, rng.randint(17, 23)], f32, table_slack=6)),
        ("MQA (2 query heads, 1 KV head, head_dim 8), pages of 3, scale 0.37",
         _case(rng, 2, 1, 8, 3, [rng.randint(2, 9), 15], f32, scale=0.37, table_slack=6)),
        ("scores growing along the sequence into the thousands (the running max rises in every block), scale 25",
         _case(rng, 2, 2, 16, 8, [rng.randint(33, 40), 16], f32, scale=25.0, table_slack=3, growing=True)),
        # Padded tiles in both directions, and the first row filled exactly (no padding column): a read past
        # it lands in the next row.
        ("GQA (6 query heads, 2 KV heads: groups of 3, tile rows padded to 4) with head_dim 12 (padded to 16); a "
         "sequence whose pages fill its block-table row exactly (16 tokens, 4 pages of 4, no padding column)",
         _case(rng, 6, 2, 12, 4, [16, rng.randint(2, 7)], f32, table_slack=0)),
    ]


def _triton_bf16_case(seed: int):
    """The bfloat16 case of the kernel: GQA, pages of 4, two or three blocks of BLOCK_N tokens. Its answer is
    not compared (the interpreter cannot compute bfloat16: below); the arithmetic is watched instead."""
    rng = random.Random(seed + 101)
    return ("bfloat16 inputs: GQA (4 query heads, 2 KV heads, head_dim 16), pages of 4, scale 1",
            _case(rng, 4, 2, 16, 4, [rng.randint(17, 40), rng.randint(3, 9)], torch.bfloat16, scale=1.0,
                  table_slack=6))


# Arithmetic whose result is rounded: done on 16-bit floats, it loses what float32 keeps. Comparisons, max,
# min, where, negation, abs and conversions are exact in any dtype and are not noted.
_ROUNDING_BINARY = frozenset({"add", "subtract", "multiply", "divide", "true_divide", "fmod", "remainder", "power"})


_EXACT_UNARY = frozenset({"negative", "absolute", "fabs", "floor", "ceil", "trunc", "rint", "sign"})


def _is_16_bit_float(dtype) -> bool:
    scalar = getattr(dtype, "scalar", dtype)
    return bool(getattr(scalar, "is_bf16", lambda: False)() or getattr(scalar, "is_fp16", lambda: False)())


@contextlib.contextmanager
def _float16_arithmetic():
    """[(operation, dtype)]: the rounding operations the Triton interpreter ran on bfloat16 / float16 values
    in the block (a product, a sum, an exp, a reduction's sum, a dot's accumulator). A `tl.dot` of 16-bit
    operands into a float32 accumulator is float32 arithmetic (the products of two bfloat16 numbers are
    exact in float32) and is not noted. Recorded as plain data, as `_table_reads`."""
    from autograder.recording.active import active_membrane

    active = active_membrane()
    with _checking._hooked("float16_ops", [], _checking._fill_list) as ops:
        if active is not None and active.mode == "replay":
            yield ops
            return
        with _watch_float16_arithmetic(ops):
            yield ops


@contextlib.contextmanager
def _watch_float16_arithmetic(ops):
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    reduce_ops = interpreter.ReduceOps

    def note(what, dtype):
        entry = (what, str(getattr(dtype, "scalar", dtype)))
        if entry not in ops and len(ops) < 20:
            ops.append(entry)

    def binary_op(lhs, rhs, op):
        if getattr(op, "__name__", "") in _ROUNDING_BINARY and _is_16_bit_float(lhs.dtype):
            note(op.__name__, lhs.dtype)
        return original["binary_op"](lhs, rhs, op)

    def unary_op(arg, op):
        if getattr(op, "__name__", "") not in _EXACT_UNARY and _is_16_bit_float(arg.dtype):
            note(getattr(op, "__name__", "a unary operation"), arg.dtype)
        return original["unary_op"](arg, op)

    def create_fma(x, y, z):
        if _is_16_bit_float(x.dtype):
            note("fma", x.dtype)
        return original["create_fma"](x, y, z)

    def create_dot(a, b, d, *args, **kwargs):
        if _is_16_bit_float(d.dtype):
            note("dot accumulator", d.dtype)
        return original["create_dot"](a, b, d, *args, **kwargs)

    def reduce_sum(self, input):
        if _is_16_bit_float(input.dtype):
            note("sum", input.dtype)
        return original_sum(self, input)

    hooks = {"binary_op": binary_op, "unary_op": unary_op, "create_fma": create_fma, "create_dot": create_dot}
    original = {name: getattr(builder, name) for name in hooks}
    kept = {name: vars(builder)[name] for name in hooks if name in vars(builder)}  # instance attributes, if any
    original_sum = reduce_ops.sum
    for name, hook in hooks.items():
        setattr(builder, name, hook)
    reduce_ops.sum = reduce_sum
    try:
        yield
    finally:
        reduce_ops.sum = original_sum
        for name in hooks:
            if name in kept:
                setattr(builder, name, kept[name])
            else:
                delattr(builder, name)  # the class's own method again


def _check_triton_bf16(name, impl, seed, watched):
    """In the interpreter: the kernel on bfloat16 inputs does its arithmetic in float32 (or wider). The
    interpreter keeps bfloat16 values as raw 16-bit integers and its arithmetic on them (a product, a sum, a
    `tl.dot`) works on those bits, and its conversion to bfloat16 truncates, so the answer of this case says
    nothing and is not compared: which operations ran on 16-bit floats is what the check reads."""
    label, case = _triton_bf16_case(seed)
    shown = _describe(name, label, case)
    given = [t.clone() for t in case[:5]]
    with watch_calls(watched, allowed=TRITON_DECODE_HELPERS) as hits, _float16_arithmetic() as ops:
        got = call(shown, impl, *given, case[5])
    if hits:
        fail(f"{name} {REFERENCE_MESSAGE} (it calls {hits[0][0]}.{hits[0][1]})")
    expect(is_tensor(got) and tuple(got.shape) == tuple(case[0].shape) and got.dtype == torch.bfloat16,
           lambda: f"{shown}: must return a bfloat16 tensor of shape {list(case[0].shape)} (q's), got "
                   f"{kind_of(got)} {list(got.shape) if is_tensor(got) else ''} {got.dtype if is_tensor(got) else ''}",
           rule="shape and dtype")
    if ops:
        done = ", ".join(f"{what} ({dtype})" for what, dtype in ops[:6])
        broke("float32 or wider",
              f"{shown}: your kernel computed in 16-bit floats: {done}. Every score, weight and sum must be float32: "
              "convert K and V up after loading them (`.to(tl.float32)`) and keep the products, exps and sums in "
              "float32 (a `tl.dot` may take bfloat16 operands into its float32 accumulator); the given end rounds "
              "the result to q's dtype once, when it stores it")


# What the notebook's wrapper may ask triton_decode (is this the interpreter? are the inputs valid?): none of
# them computes attention. The rest of the module, its kernels and their launch, stays watched.
TRITON_DECODE_HELPERS = tuple(f"course_lib.attention.triton_decode:{helper}" for helper in
                              ("interpreting", "num_sms", "_check_triton_mode", "_pow2_at_least", "check_inputs"))


def _triton_forbidden():
    from course_lib.attention import triton_decode

    return (triton_decode.paged_decode_triton,)


@check("paged_attention_triton", forbidden=_triton_forbidden)
def check_paged_attention_triton(impl, seed, allow_reference):
    import triton.runtime.jit as triton_jit

    name = "paged_attention_triton"
    device = triton_device()
    tol = 1e-4 if device == "cpu" else 2e-3  # the GPU's fp32 dot may use TF32 unless asked for "ieee"
    import course_lib.attention.triton_decode as triton_decode

    modules = _reference_modules() + [triton_decode]
    for label, case in _triton_cases(seed):
        case = tuple(x.to(device) if torch.is_tensor(x) else x for x in case)
        with watch_calls(modules if not allow_reference else [], allowed=TRITON_DECODE_HELPERS) as hits:
            _compare(name, f"{label} [{device}]", impl, case, tol, watch_table=device == "cpu")
        if hits:  # (triton_decode's small helpers are spared: the wrapper may ask them, never for attention)
            fail(f"{name} {REFERENCE_MESSAGE} (it calls {hits[0][0]}.{hits[0][1]})")
    if device == "cpu":  # (on a GPU the arithmetic cannot be watched: the kernel compiles)
        _check_triton_bf16(name, impl, seed, modules if not allow_reference else [])
    # A Triton kernel ran: `kernel[grid](...)` goes through triton/runtime/jit.py on the GPU and in
    # the interpreter alike (KernelInterface.__getitem__ returns a lambda that calls run). Watched in
    # a run of its own: the interpreter makes hundreds of calls there, which would crowd the
    # reference's out of one shared list of calls (and two nested profilers hide each other's).
    label, case = _triton_cases(seed)[0]
    case = tuple(x.to(device) if torch.is_tensor(x) else x for x in case)
    launchers = [triton_jit]  # JITFunction.run (a GPU), and the interpreter's run (TRITON_INTERPRET=1)
    try:
        from triton.runtime.interpreter import InterpretedFunction

        launchers.append(InterpretedFunction.run)
    except ImportError:  # a Triton without the interpreter
        pass
    with watch_calls(launchers) as hits:
        call(_describe(name, label, case), impl, *case)
    expect(any(func in ("run", "<lambda>") for _, func in hits),
           f"{name} on {label}: no Triton kernel was launched; the wrapper must run your paged_decode_kernel "
           "(kernel[grid](...)), not compute the attention with torch", rule="pages read in place")
