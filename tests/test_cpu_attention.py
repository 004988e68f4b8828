"""The "cpu" backend: the C decode kernel, how it is built, and what happens when it cannot be.

Its numbers are checked against the dense oracle in test_attention_backends.py (random shapes,
partial pages, permuted tables, NaN in unowned slots) and its tokens in test_engine_parity.py.
"""
from __future__ import annotations

import torch
import pytest

from course_lib import EngineConfig, LLMEngine
from course_lib.attention import cpu_decode, default_backend
from course_lib.attention.torch_paged import paged_decode_torch

from test_attention_backends import TOLERANCE, assert_matches_oracle, make_paged_case


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """The kernel module as if never built: empty cache folder, no loaded library, no error."""
    monkeypatch.setenv("COURSE_LIB_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpu_decode.KERNEL, "libraries", {})
    monkeypatch.setattr(cpu_decode.KERNEL, "error", None)
    return tmp_path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_queries_from_a_fused_projection(dtype):
    """The model hands attention q as a view into its fused qkv output: rows are strided."""
    case = make_paged_case([5, 16, 17, 33], 6, 2, 16, 8, dtype=dtype, seed=5)
    qkv = torch.randn(4, 6 + 2 * 2, 16, dtype=dtype)
    qkv[:, :6] = case.q
    q = qkv[:, :6]
    assert not q.is_contiguous()
    out = cpu_decode.paged_decode_cpu(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    assert_matches_oracle(out, case, TOLERANCE[dtype])


def test_one_plan_serves_every_layer():
    case = make_paged_case([3, 9, 20], 4, 2, 8, 4, dtype=torch.float64, seed=6)
    plan = cpu_decode.plan_decode_cpu(case.k_cache, case.block_tables, case.seq_lens)
    out = cpu_decode.paged_decode_cpu(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                      case.scale, plan=plan)
    assert plan.max_len == 20
    assert_matches_oracle(out, case, 1e-10)


def test_bad_input_is_named():
    case = make_paged_case([3, 9], 4, 2, 8, 4, dtype=torch.float32, seed=1)
    args = (case.k_cache, case.v_cache, case.block_tables)
    with pytest.raises(ValueError, match="supports float32, float64, not bfloat16"):
        cpu_decode.paged_decode_cpu(case.q.bfloat16(), *args, case.seq_lens, 1.0)
    too_long = case.block_tables.shape[1] * 4 + 1  # one token more than the table can map
    with pytest.raises(ValueError, match=rf"seq_lens must be in 1\.\.{too_long - 1} \(table width x page size\)"):
        cpu_decode.paged_decode_cpu(case.q, *args, torch.tensor([3, too_long], dtype=torch.int32), 1.0)
    wild = case.block_tables.clone()
    wild[1, 0] = case.k_cache.shape[0]  # one past the last page, in a page sequence 1 reads
    with pytest.raises(ValueError, match=r"page ids outside 0\.\.\d+ where a sequence reads"):
        cpu_decode.paged_decode_cpu(case.q, case.k_cache, case.v_cache, wild, case.seq_lens, 1.0)
    with pytest.raises(ValueError, match="must be int32"):
        cpu_decode.paged_decode_cpu(case.q, *args, case.seq_lens.long(), 1.0)
    with pytest.raises(ValueError, match="does not fit caches"):
        cpu_decode.paged_decode_cpu(case.q[:, :3], *args, case.seq_lens, 1.0)


def test_the_oracle_catches_a_broken_kernel(fresh_build, monkeypatch):
    """A check that cannot fail is a defect: build a kernel that reads every token from row 0
    of its page and watch the comparison with the torch backend fail."""
    source = cpu_decode.SOURCE.read_text()
    broken = source.replace("* page_size + row;", "* page_size;")
    assert broken != source
    path = fresh_build / "broken.c"
    path.write_text(broken)
    monkeypatch.setattr(cpu_decode.KERNEL, "source", path)
    case = make_paged_case([6, 11], 4, 2, 8, 4, dtype=torch.float64, seed=2)
    wrong = cpu_decode.paged_decode_cpu(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                        case.scale)
    right = paged_decode_torch(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    assert not torch.allclose(wrong, right)


def test_built_once_then_loaded_from_the_cache(fresh_build):
    assert cpu_decode.available() == (True, "")
    built = sorted((fresh_build / "kernels").glob("*.so"))
    assert len(built) == 1 and "float" in built[0].name
    stamp = built[0].stat().st_mtime_ns
    cpu_decode.KERNEL.libraries.clear()
    assert cpu_decode.available() == (True, "")
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt


def test_without_a_compiler_auto_falls_back_and_cpu_says_why(fresh_build, monkeypatch, small_model):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    ok, why = cpu_decode.available()
    assert not ok and "no C compiler" in why and "no-such-compiler-xyz" in why
    assert default_backend("cpu", torch.float32) == "torch"
    engine = LLMEngine(small_model, EngineConfig())
    assert engine.runner.attention_backend == "torch"
    with pytest.raises(RuntimeError, match="cpu attention backend is unavailable: no C compiler"):
        LLMEngine(small_model, EngineConfig(attention_backend="cpu"))


def test_a_compile_error_is_reported(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    ok, why = cpu_decode.available()
    assert not ok and "compiling cpu_decode.c failed" in why


def test_auto_picks_the_kernel_only_where_it_applies():
    assert default_backend("cpu", torch.float32) == "cpu"
    assert default_backend("cpu", torch.float64) == "cpu"
    assert default_backend("cpu", torch.bfloat16) == "torch"  # no bf16 kernel: the torch backend serves it


def test_large_calls_split_their_sequences_over_threads(monkeypatch):
    """Each thread takes a run of whole sequences with its own scratch: the result is bit for bit
    the single-threaded one."""
    case = make_paged_case([5, 16, 17, 33, 9, 2, 40], 6, 2, 16, 8, dtype=torch.float64, seed=9)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = cpu_decode.paged_decode_cpu(*args)
        monkeypatch.setattr(cpu_decode, "PARALLEL_MIN_WORK", 1)
        pieces, pool = [], cpu_decode._pool()

        class CountingPool:
            def submit(self, fn, *call):
                pieces.append(call[11])  # the piece's number of sequences
                return pool.submit(fn, *call)

        monkeypatch.setattr(cpu_decode, "_pool", CountingPool)
        assert cpu_decode.paged_decode_cpu(*args).equal(one) and pieces == []  # one thread: no pool
        torch.set_num_threads(3)
        many = cpu_decode.paged_decode_cpu(*args)
    finally:
        torch.set_num_threads(threads)
    assert pieces == [2, 2, 3]
    assert torch.equal(one, many)
    assert_matches_oracle(many, case, 1e-10)
