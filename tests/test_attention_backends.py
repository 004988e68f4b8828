"""The reference and torch paged-attention backends against a float64 dense oracle.

Every case is built adversarially: pages are handed out in a random order, every cache slot that
no sequence owns (the tail of each last page, the spare pages) holds NaN, and block-table
entries past a sequence's pages point at other sequences' pages or at NaN pages. A backend that
reads one slot it should not, or lets a masked NaN through as 0 * NaN, fails.

The helpers here (`make_paged_case`, `oracle`) are shared with `test_triton_attention.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import paged_decode, paged_prefill, write_kv


@dataclass
class PagedCase:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]: decode has one row per sequence
    k_cache: torch.Tensor  # [num_pages, page_size, num_kv_heads, head_dim], NaN where unowned
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_pages]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    keys: list  # per sequence, the float64 [seq_len, num_kv_heads, head_dim] it wrote
    values: list
    scale: float

    def decode(self, backend, **kwargs):
        return paged_decode(self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, self.scale,
                            backend=backend, **kwargs)

    def prefill(self, backend):
        return paged_prefill(self.q, self.k_cache, self.v_cache, self.block_tables, self.query_start_loc,
                             self.seq_lens, self.scale, backend=backend)


def make_paged_case(seq_lens, num_heads, num_kv_heads, head_dim, page_size, *, query_lens=None,
                    dtype=torch.float32, device="cpu", seed=0, spare_pages=2, table_padding="foreign",
                    contents=None):
    """A paged cache holding `seq_lens[s]` random tokens per sequence, and new queries.

    query_lens: new query tokens per sequence (all 1: a decode batch). table_padding: what the
    block table holds past a sequence's pages: "foreign" (random other pages, NaN ones included)
    or an int. contents: reuse the (keys, values, q) of another case, to page the same tokens
    differently.
    """
    gen = torch.Generator().manual_seed(seed)
    query_lens = list(query_lens or [1] * len(seq_lens))
    pages_per_seq = [math.ceil(n / page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + max(1, spare_pages)
    max_pages = max(pages_per_seq) + 1  # a spare column: never to be read
    # Page 0 is never owned, so it is all NaN: a kernel that turns a masked-off page-table entry
    # into page 0 (a common default) and then uses that data gets caught.
    order = 1 + torch.randperm(num_pages - 1, generator=gen)

    k_cache = torch.full((num_pages, page_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    if table_padding == "foreign":
        block_tables = torch.randint(0, num_pages, (len(seq_lens), max_pages), generator=gen, dtype=torch.int32)
    else:
        block_tables = torch.full((len(seq_lens), max_pages), int(table_padding), dtype=torch.int32)

    if contents is None:
        def tokens(n):
            return torch.randn(n, num_kv_heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)

        keys = [tokens(n) for n in seq_lens]
        values = [tokens(n) for n in seq_lens]
        q = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    else:
        keys, values, q = contents
    next_page = 0
    for s, n in enumerate(seq_lens):
        pages = order[next_page:next_page + pages_per_seq[s]]
        next_page += pages_per_seq[s]
        block_tables[s, :len(pages)] = pages.to(torch.int32)
        t = torch.arange(n)
        slots = pages[t // page_size] * page_size + t % page_size
        write_kv(k_cache, v_cache, keys[s].to(dtype), values[s].to(dtype), slots)

    query_start_loc = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.tensor(query_lens).cumsum(0)
    return PagedCase(
        q=q.to(device), k_cache=k_cache.to(device), v_cache=v_cache.to(device),
        block_tables=block_tables.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=query_start_loc.to(device),
        keys=[k.double() for k in keys], values=[v.double() for v in values], scale=head_dim ** -0.5,
    )


def oracle(case: PagedCase) -> torch.Tensor:
    """Dense float64 attention on the unpaged keys and values, with an explicit causal mask
    offset by the tokens cached before this step: query j of sequence s (with n_s queries)
    sits at position seq_len - n_s + j and sees keys 0 .. that position."""
    starts = case.query_start_loc.tolist()
    num_heads = case.q.shape[1]
    out = torch.empty(case.q.shape, dtype=torch.float64)
    for s, (k, v) in enumerate(zip(case.keys, case.values)):
        n, total = starts[s + 1] - starts[s], k.shape[0]
        q = case.q[starts[s]:starts[s + 1]].double().cpu().transpose(0, 1)  # [H, n, D]
        group = num_heads // k.shape[1]
        k_h = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [H, L, D]: clarity over speed
        v_h = v.transpose(0, 1).repeat_interleave(group, dim=0)
        position = total - n + torch.arange(n)
        mask = torch.arange(total)[None, :] <= position[:, None]  # [n, L]
        o = F.scaled_dot_product_attention(q, k_h, v_h, attn_mask=mask, scale=case.scale)
        out[starts[s]:starts[s + 1]] = o.transpose(0, 1)
    return out


def assert_matches_oracle(actual, case, atol, rtol=None):
    expected = oracle(case)
    assert actual.dtype == case.q.dtype and actual.shape == case.q.shape
    assert not torch.isnan(actual).any(), "NaN from an unowned slot leaked into the result"
    torch.testing.assert_close(actual.double().cpu(), expected, atol=atol, rtol=atol if rtol is None else rtol)


TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


@st.composite
def shapes(draw, prefill=False):
    num_kv_heads = draw(st.integers(1, 3))
    seq_lens = draw(st.lists(st.integers(1, 24), min_size=1, max_size=3))
    query_lens = [draw(st.integers(1, n)) for n in seq_lens] if prefill else None
    return dict(seq_lens=seq_lens, query_lens=query_lens, num_kv_heads=num_kv_heads,
                num_heads=num_kv_heads * draw(st.integers(1, 3)), head_dim=draw(st.integers(1, 9)),
                page_size=draw(st.integers(1, 6)), dtype=draw(st.sampled_from([torch.float64, torch.float32])),
                seed=draw(st.integers(0, 2**16)), table_padding=draw(st.sampled_from(["foreign", -1, 0])))


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
@settings(max_examples=25, deadline=None)
@given(shape=shapes())
def test_decode_matches_dense_oracle(backend, shape):
    case = make_paged_case(**shape)
    assert_matches_oracle(case.decode(backend), case, TOLERANCE[shape["dtype"]])


@pytest.mark.parametrize("backend", ["reference", "torch"])
@settings(max_examples=25, deadline=None)
@given(shape=shapes(prefill=True))
def test_prefill_mixed_with_decodes_matches_dense_oracle(backend, shape):
    case = make_paged_case(**shape)
    assert_matches_oracle(case.prefill(backend), case, TOLERANCE[shape["dtype"]])


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
def test_partial_pages_permuted_tables_and_nan_slots(backend):
    """The fixed adversarial batch: lengths around the page boundary, a prompt chunk with an offset
    (17 cached + 23 new), a whole prompt, and decodes, in one call."""
    page = 8
    seq_lens = [1, page - 1, page, page + 1, 37, 40]
    query_lens = [1, 1, page, 1, 37, 23]
    case = make_paged_case(seq_lens, 6, 2, 16, page, query_lens=query_lens, dtype=torch.float64, seed=7)
    assert case.k_cache.isnan().any()  # the trap is armed
    assert_matches_oracle(case.prefill(backend), case, 1e-10)
    decode = make_paged_case(seq_lens, 6, 2, 16, page, dtype=torch.float64, seed=8)
    assert_matches_oracle(decode.decode(backend), decode, 1e-10)


def test_prefill_of_one_token_equals_decode():
    """A decode is a chunk of one: both entry points agree on a batch of single queries."""
    case = make_paged_case([3, 17, 9], 4, 2, 8, 4, dtype=torch.float64, seed=3)
    torch.testing.assert_close(case.prefill("torch"), case.decode("torch"), atol=1e-12, rtol=1e-12)


def test_torch_backend_keeps_reduced_precision_dtype():
    case = make_paged_case([5, 12], 4, 2, 8, 4, dtype=torch.bfloat16, seed=4)
    assert_matches_oracle(case.decode("torch"), case, atol=2e-2)


def test_bench_attention_runs_and_agrees_with_sdpa(tmp_path, capsys):
    """`python -m course_lib bench attention` on a tiny CPU shape: one table, well-formed JSON, and
    the torch backend's output equal to SDPA's (speed itself is never asserted)."""
    import json

    from course_lib.bench.attention import main as bench_main

    path = tmp_path / "attention.json"
    code = bench_main(["--device", "cpu", "--batch", "1,2", "--context", "20", "--heads", "4",
                       "--kv-heads", "2", "--head-dim", "16", "--page-size", "8", "--iters", "2", "--warmup", "1",
                       "--json", str(path)])
    assert code == 0
    table = capsys.readouterr().out
    assert "torch/sdpa" in table and "copy bandwidth" in table
    result = json.loads(path.read_text())
    assert result["benchmark"] == "attention" and result["device_type"] == "cpu" and result["dtype"] == "float32"
    assert result["copy_bandwidth_gbs"] > 0 and result["backends"] == ["sdpa", "torch", "cpu", "torch_plan"]
    assert [(r["batch"], r["context"]) for r in result["results"]] == [(1, 20), (2, 20)]
    for row in result["results"]:
        # torch_plan (the per-step plan of the torch backend) is timed but is not attention: no bandwidth.
        assert set(row["time_us"]) == {"sdpa", "torch", "cpu", "torch_plan"} and row["ratio"]["torch/sdpa"] > 0
        assert row["ratio"]["cpu/sdpa"] > 0 and set(row["bandwidth_frac_of_copy"]) == {"sdpa", "torch", "cpu"}
        assert row["bytes"] == 4 * (2 * row["batch"] * 20 * 2 * 16 + 2 * row["batch"] * 4 * 16)
        assert row["max_abs_err_vs_sdpa"]["torch"] < 1e-5 and row["max_abs_err_vs_sdpa"]["cpu"] < 1e-5


@pytest.mark.parametrize("gather_bytes", [1, 10_000])
def test_torch_backend_gathers_in_sequence_chunks(monkeypatch, gather_bytes):
    """A small gather budget splits the batch into chunks of sequences (one at a time with 1
    byte); the result must not depend on how the sequences are split."""
    from course_lib.attention import torch_paged

    monkeypatch.setattr(torch_paged, "GATHER_BYTES", gather_bytes)
    seq_lens, query_lens = [1, 7, 8, 9, 37, 40], [1, 1, 8, 1, 37, 23]
    prefill = make_paged_case(seq_lens, 6, 3, 16, 8, query_lens=query_lens, dtype=torch.float64, seed=11)
    assert_matches_oracle(prefill.prefill("torch"), prefill, 1e-10)
    decode = make_paged_case(seq_lens, 6, 3, 16, 8, dtype=torch.float64, seed=12)
    assert torch_paged._seqs_per_gather(40, 3, 16, 8) < 6  # the chunked path really runs
    assert_matches_oracle(decode.decode("torch"), decode, 1e-10)


def test_a_plan_made_once_serves_every_layer():
    """The engine plans a step once and reuses the plan in every layer: a plan must depend only on
    the block tables and lengths, never on the layer's queries or cache contents."""
    from course_lib.attention.torch_paged import paged_decode_torch, paged_prefill_torch, plan_decode, plan_prefill

    seq_lens, query_lens = [3, 16, 17, 30], [3, 1, 5, 30]

    def two_layers(**kw):
        """Two cases with the same block tables (same seed) holding different tokens and queries."""
        other = make_paged_case(seq_lens, 4, 2, 8, 4, dtype=torch.float64, seed=99, **kw)
        return [make_paged_case(seq_lens, 4, 2, 8, 4, dtype=torch.float64, seed=21, **kw),
                make_paged_case(seq_lens, 4, 2, 8, 4, dtype=torch.float64, seed=21,
                                contents=(other.keys, other.values, other.q), **kw)]

    layers = two_layers(query_lens=query_lens)
    first = layers[0]
    prefill_plan = plan_prefill(first.k_cache, first.block_tables, first.query_start_loc, first.seq_lens)
    assert not torch.equal(layers[0].q, layers[1].q)
    for case in layers:  # same tables and lengths, different queries and caches: like two layers
        assert torch.equal(case.block_tables, first.block_tables)
        out = paged_prefill_torch(case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
                                  case.seq_lens, case.scale, plan=prefill_plan)
        assert_matches_oracle(out, case, 1e-10)
    decodes = two_layers()
    decode_plan = plan_decode(decodes[0].k_cache, decodes[0].block_tables, decodes[0].seq_lens)
    for case in decodes:
        out = paged_decode_torch(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
                                 plan=decode_plan)
        assert_matches_oracle(out, case, 1e-10)


def test_decode_of_equal_lengths_needs_no_mask():
    """Equal lengths, all decodes: the plan has nothing to hide and skips the mask; the NaN in the
    rest of each last page must still never be read."""
    from course_lib.attention.torch_paged import plan_decode

    case = make_paged_case([9, 9, 9], 6, 3, 8, 4, dtype=torch.float64, seed=5)
    assert plan_decode(case.k_cache, case.block_tables, case.seq_lens).hidden is None
    assert case.k_cache.isnan().any()
    assert_matches_oracle(case.decode("torch"), case, 1e-10)
