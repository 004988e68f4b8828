"""The Triton paged-attention kernels against a float64 dense oracle.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors): exact but
slow, so every case here is one small batch that mixes the lengths that matter
({1, P-1, P, P+1, 37, 130} for page size P), rather than a cartesian product of shapes. With CUDA
the same tests run on the GPU, plus the bf16 ones.

Cases are adversarial (see `test_attention_backends.make_paged_case`): randomly permuted block
tables, NaN in every slot no sequence owns, block-table padding that points at NaN pages.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the kernel module is first
# imported: set it before anything imports course_lib.attention.triton_*.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from test_attention_backends import assert_matches_oracle, make_paged_case, oracle  # noqa: E402

from course_lib.attention.triton_decode import choose_num_splits, paged_decode_triton  # noqa: E402
from course_lib.attention.triton_prefill import paged_prefill_triton  # noqa: E402

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="bf16 Triton kernels are tested on CUDA only "
                                                    "(the interpreter has no bf16 tensor cores to model)")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def lengths_around(page_size):
    """One batch with every length that stresses paging: a single token, a page minus one, a full
    page, a page plus one (a second, nearly empty page), and two odd multi-page lengths."""
    return sorted({1, page_size - 1, page_size, page_size + 1, 37, 130} - {0})


# (num_heads, num_kv_heads, head_dim, page_size): every listed value appears at least once.
# (4, 4): plain multi-head; (8, 2): GQA; (5, 1) and (6, 1): MQA with a group that is not a power
# of two; head_dim 80 is padded to 128 in the kernel and 16 is the tl.dot minimum.
DECODE_CASES = [
    (4, 4, 16, 1),
    (8, 2, 64, 8),
    (5, 1, 80, 16),
    (6, 1, 64, 32),
]


def case_id(case):
    return "h{}-kv{}-d{}-p{}".format(*case)


@pytest.mark.parametrize(
    "shape, dtype",
    [(shape, torch.float32) for shape in DECODE_CASES]
    + [(DECODE_CASES[1], torch.float16), (DECODE_CASES[2], torch.float16)],
    ids=lambda x: case_id(x) if isinstance(x, tuple) else str(x).replace("torch.", ""),
)
def test_decode_matches_oracle(shape, dtype):
    heads, kv_heads, head_dim, page = shape
    case = make_paged_case(lengths_around(page), heads, kv_heads, head_dim, page, dtype=dtype, device=DEVICE,
                           seed=page)
    out = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
                              num_splits=1 if dtype == torch.float32 else 3)
    assert_matches_oracle(out, case, TOLERANCE[dtype])


@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_bf16_on_cuda(num_splits):
    case = make_paged_case(lengths_around(16), 32, 8, 128, 16, dtype=torch.bfloat16, device=DEVICE, seed=1)
    out = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
                              num_splits=num_splits)
    assert_matches_oracle(out, case, TOLERANCE[torch.bfloat16])


def test_page_size_does_not_change_the_result():
    """The same tokens paged by 1 and by 16 give the same output: the kernel walks logical token
    positions in the same blocks whatever the page size, so even the rounding is identical."""
    by_16 = make_paged_case(lengths_around(16), 8, 2, 16, 16, device=DEVICE, seed=11)
    contents = ([k.float() for k in by_16.keys], [v.float() for v in by_16.values], by_16.q.cpu())
    by_1 = make_paged_case(lengths_around(16), 8, 2, 16, 1, device=DEVICE, seed=12, contents=contents)
    outs = [paged_decode_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale, num_splits=1)
            for c in (by_16, by_1)]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-6)
    assert_matches_oracle(outs[0], by_16, 1e-5)


def test_every_split_count_gives_the_same_result():
    """Split-KV is exact for any number of splits, including splits that cover no tokens: splits
    are whole blocks of tokens, so 16 splits of a 130-token context leave some of them empty even
    for the longest sequence, and the 1-token sequence has 15 empty ones."""
    case = make_paged_case(lengths_around(16), 6, 1, 16, 16, device=DEVICE, seed=5)
    expected = oracle(case)
    outs = {}
    for num_splits in (1, 3, 16):
        outs[num_splits] = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables,
                                               case.seq_lens, case.scale, num_splits=num_splits)
        assert not outs[num_splits].isnan().any(), f"NaN with {num_splits} splits"
        torch.testing.assert_close(outs[num_splits].double().cpu(), expected, atol=1e-5, rtol=1e-5)
    for num_splits, out in outs.items():
        torch.testing.assert_close(out, outs[1], atol=1e-6, rtol=1e-6, msg=f"{num_splits} splits != 1 split")
    # The automatic choice (one split in the interpreter, which runs programs one at a time).
    auto = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    torch.testing.assert_close(auto, outs[1], atol=1e-6, rtol=1e-6)


def test_choose_num_splits():
    sms = 132  # H100 / H200
    # A big batch already fills the GPU: splitting would only add the reduce's traffic.
    assert choose_num_splits(256, 8, 16384, sms) == 1
    assert choose_num_splits(64, 8, 4096, sms) == 1
    # One long sequence: split until there are about two programs per SM.
    assert choose_num_splits(1, 8, 16384, sms) == 33
    # ... but never into splits shorter than the minimum.
    assert choose_num_splits(1, 8, 512, sms) == 2
    assert choose_num_splits(1, 8, 200, sms) == 1
    for batch in (1, 2, 8, 16, 64):
        for context in (1, 100, 512, 4096, 16384, 100_000):
            n = choose_num_splits(batch, 8, context, sms)
            assert 1 <= n <= 64
            assert n == 1 or context // n >= 256


def test_block_table_padding_is_never_dereferenced():
    """Entries past a sequence's pages may hold anything (here a page number far outside the pool):
    the kernel must not follow them."""
    case = make_paged_case(lengths_around(8), 4, 2, 16, 8, device=DEVICE, seed=9, table_padding=2**30)
    out = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
                              num_splits=2)
    assert_matches_oracle(out, case, 1e-5)


# (seq_len, new query tokens): decodes (first token, across a page edge, long context), a whole
# prompt, a prompt chunk after 17 cached tokens, a short chunk after 15.
PREFILL_BATCH = [(1, 1), (17, 1), (37, 37), (40, 23), (130, 1), (20, 5)]
PREFILL_CASES = [(8, 2, 64, 16), (5, 1, 80, 8), (4, 4, 16, 1)]


@pytest.mark.parametrize(
    "shape, dtype",
    [(shape, torch.float32) for shape in PREFILL_CASES] + [(PREFILL_CASES[0], torch.float16)],
    ids=lambda x: case_id(x) if isinstance(x, tuple) else str(x).replace("torch.", ""),
)
def test_prefill_mixed_with_decodes_matches_oracle(shape, dtype):
    heads, kv_heads, head_dim, page = shape
    seq_lens, query_lens = zip(*PREFILL_BATCH)
    case = make_paged_case(list(seq_lens), heads, kv_heads, head_dim, page, query_lens=list(query_lens),
                           dtype=dtype, device=DEVICE, seed=21)
    out = paged_prefill_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
                               case.seq_lens, case.scale)
    assert_matches_oracle(out, case, TOLERANCE[dtype])


@needs_cuda
def test_prefill_bf16_on_cuda():
    seq_lens, query_lens = zip(*PREFILL_BATCH)
    case = make_paged_case(list(seq_lens), 32, 8, 128, 16, query_lens=list(query_lens), dtype=torch.bfloat16,
                           device=DEVICE, seed=22)
    out = paged_prefill_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
                               case.seq_lens, case.scale)
    assert_matches_oracle(out, case, TOLERANCE[torch.bfloat16])


def test_prefill_of_single_tokens_equals_decode():
    case = make_paged_case(lengths_around(8), 8, 2, 16, 8, device=DEVICE, seed=31)
    decode = paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    prefill = paged_prefill_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
                                   case.seq_lens, case.scale)
    torch.testing.assert_close(prefill, decode, atol=1e-6, rtol=1e-6)


def test_backend_dispatch_and_clear_errors():
    case = make_paged_case([3, 9], 4, 2, 16, 4, device=DEVICE, seed=41)
    assert_matches_oracle(case.decode("triton", num_splits=2), case, 1e-5)
    assert_matches_oracle(case.prefill("triton"), case, 1e-5)
    # q may be a strided view (e.g. a slice of a fused qkv projection): strides are passed through.
    wide = torch.zeros(*case.q.shape[:2], 3 * case.q.shape[2], device=DEVICE)
    wide[..., 16:32] = case.q
    strided = paged_decode_triton(wide[..., 16:32], case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                  case.scale)
    assert_matches_oracle(strided, case, 1e-5)
    as64 = [t.double() for t in (case.q, case.k_cache, case.v_cache)]
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_triton(*as64, case.block_tables, case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="dtype"):
        paged_prefill_triton(*as64, case.block_tables, case.query_start_loc, case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="one dtype"):
        paged_decode_triton(case.q.half(), case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_decode_triton(case.q[:, :3], case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
                            num_splits=0)


# The interpreter accepts some programs the GPU compiler rejects. On a machine without a GPU we can
# still compile the kernels for Hopper (sm_90) ahead of time: Triton ships ptxas. This runs in a
# subprocess because this process decorated the kernels for the interpreter.
_COMPILE_FOR_SM90 = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from course_lib.attention import triton_decode, triton_prefill

    def compile(fn, constexprs, pointers, ints):
        # Specialise like a real launch: ints equal to 1 (unit strides) become constants and
        # pointers / multiples of 16 get the divisibility hint that enables vector loads.
        signature, attrs, constexprs = {}, {}, dict(constexprs)
        for i, name in enumerate(fn.arg_names):
            if name in constexprs:
                signature[name] = "constexpr"
            elif name in pointers:
                signature[name], attrs[(i,)] = pointers[name], [["tt.divisibility", 16]]
            elif name == "qk_scale":
                signature[name] = "fp32"
            elif ints[name] == 1:
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32"
                if ints[name] % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))

    H, KVH, D, P, PAGES, SPLITS = 32, 8, 128, 16, 1024, 8
    cache = dict(stride_page=P * KVH * D, stride_row=KVH * D, stride_kvh=D, stride_d=1,
                 stride_bts=PAGES, stride_btp=1, max_pages=PAGES)
    q_and_out = dict(stride_os=H * D, stride_oh=D, stride_od=1)
    partials = dict(stride_ps=H * SPLITS * D, stride_ph=SPLITS * D, stride_pk=D, stride_pd=1,
                    stride_ls=H * SPLITS, stride_lh=SPLITS, stride_lk=1, tokens_per_split=1024)
    io = {n: "*bf16" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
    io.update(block_tables_ptr="*i32", seq_lens_ptr="*i32")
    # bf16, the serving dtype (fp32 and fp16 differ only in the dtype of the dots), and the split
    # variant: its early return is the construct the interpreter is most lenient about.
    compile(triton_decode._decode_split_kernel,
            dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=D, HEAD_DIM_PAD=D, PAGE_SIZE=P, BLOCK_N=64,
                 SINGLE_SPLIT=False, FP32_DOT=False),
            dict(io, part_out_ptr="*fp32", part_lse_ptr="*fp32"),
            dict(cache, **q_and_out, **partials, stride_qs=H * D, stride_qh=D, stride_qd=1))
    compile(triton_decode._decode_reduce_kernel, dict(HEAD_DIM=D, HEAD_DIM_PAD=D, SPLITS_PAD=SPLITS),
            dict(out_ptr="*bf16", part_out_ptr="*fp32", part_lse_ptr="*fp32", seq_lens_ptr="*i32"),
            dict(q_and_out, **partials, num_splits=SPLITS))
    compile(triton_prefill._prefill_kernel,
            dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=16, HEAD_DIM=D, HEAD_DIM_PAD=D, PAGE_SIZE=P, BLOCK_N=64,
                 FP32_DOT=False),
            dict(io, query_start_loc_ptr="*i32"),
            dict(cache, stride_qt=H * D, stride_qh=D, stride_qd=1, stride_ot=H * D, stride_oh=D, stride_od=1))
    print("compiled")
""")


@pytest.mark.skipif(ON_CUDA, reason="with a GPU the kernels are compiled and run by the tests above")
def test_kernels_compile_for_hopper():
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], capture_output=True, text=True, env=env,
                            cwd=root, timeout=300)
    if result.returncode and "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip("this Triton build cannot assemble for sm_90 here")
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]


_IMPORTED_TOO_EARLY = textwrap.dedent("""
    import os
    os.environ.pop("TRITON_INTERPRET", None)
    import triton.language  # what building a transformers model does, before the variable is set
    import torch
    from course_lib.attention.triton_decode import paged_decode_triton
    q = torch.zeros(1, 2, 16)
    cache = torch.zeros(2, 4, 1, 16)
    try:
        paged_decode_triton(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32),
                            torch.ones(1, dtype=torch.int32), 0.25)
    except RuntimeError as e:
        print("ERROR:", e)
""")


@pytest.mark.skipif(ON_CUDA, reason="on a GPU both builds agree: nothing to mix up")
def test_triton_imported_before_the_interpreter_switch_is_a_clear_error():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _IMPORTED_TOO_EARLY], capture_output=True, text=True,
                            env=env, cwd=root, timeout=300)
    assert "ERROR: Triton was imported before TRITON_INTERPRET was set" in result.stdout, result.stderr[-3000:]


def test_engine_on_triton_serves_the_tiny_models_answers():
    """The whole engine on the Triton backend (prefill chunks and decodes, pages of 4 so every
    answer crosses pages): the same greedy answers as the plain model. On a CPU the kernels run
    in the interpreter, so the batch is small; on CUDA this is the engine's real GPU path."""
    from course_lib import EngineConfig, LLMEngine, SamplingParams, load_tiny

    model, tokenizer = load_tiny(torch.float32, DEVICE)
    prompts = [tokenizer.encode_prompt(p) for p in ("max: 38152", "reverse: 2749", "sort: 93127")]
    engine = LLMEngine(model, EngineConfig(page_size=4, attention_backend="triton", max_num_batched_tokens=24))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=6))
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == model.generate(prompt, 6), tokenizer.decode(prompt)
    assert [tokenizer.decode(o.token_ids) for o in outputs][:2] == ["8", "9472"]
