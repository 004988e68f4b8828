"""Checks for notebook 04 (paged attention): decode attention through block tables.

Each implementation is compared with a dense oracle (gather the sequence's tokens in order,
softmax(q k^T * scale) v, query head h reading KV head h // group) on MHA, GQA and MQA shapes
whose block tables are shuffled and whose unused slots hold large garbage (reading past a
sequence's length shows). Then it serves the decode rows of a float64 model in the real
engine (greedy tokens must not change). The vectorised version must not loop over tokens:
the Python lines it executes may not grow with the context length.
"""
from __future__ import annotations

import random
import sys

import torch

from course_lib import EngineConfig, LLMEngine, SamplingParams

from .. import fixtures
from .._checking import call, check, count_user_lines, drive, expect, fail, forbid_calls


def _reference_functions():
    from course_lib.attention.reference import paged_decode_reference
    from course_lib.attention.torch_paged import paged_decode_torch

    return (paged_decode_reference, paged_decode_torch)


def _reference_modules():
    import course_lib.attention as attention
    import course_lib.attention.reference as reference
    import course_lib.attention.torch_paged as torch_paged

    mods = [attention, reference, torch_paged]
    mods += [sys.modules[m] for m in ("course_lib.attention.triton_decode",) if m in sys.modules]
    return mods


def _case(rng: random.Random, num_heads, num_kv_heads, head_dim, page_size, seq_lens, dtype=torch.float64):
    """Random q and caches; each sequence's pages are scattered over the pool, its table padded
    with other pages, and every slot it does not own filled with large garbage."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    width = max(pages_per_seq) + 1
    num_pages = sum(pages_per_seq) + 3
    order = rng.sample(range(num_pages), num_pages)
    k_cache = 50 + 50 * torch.rand(num_pages, page_size, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v_cache = 50 + 50 * torch.rand(num_pages, page_size, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    tables, used = [], 0
    for n, count in zip(seq_lens, pages_per_seq):
        pages = order[used:used + count]
        used += count
        for t in range(n):
            k_cache[pages[t // page_size], t % page_size] = torch.randn(num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
            v_cache[pages[t // page_size], t % page_size] = torch.randn(num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
        tables.append(pages + [order[-1]] * (width - count))  # padding entries point at a garbage page
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen, dtype=torch.float64)
    scale = head_dim ** -0.5
    return (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), torch.tensor(tables, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32), scale)


def _oracle(q, k_cache, v_cache, block_tables, seq_lens, scale, *, kv_head_of=None, length_offset=0,
            logical_pages=False):
    """Dense attention in float64; the keyword arguments reproduce common mistakes (for hints)."""
    num_heads, page_size, num_kv_heads = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    kv_head_of = kv_head_of or (lambda h: h // group)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(q.shape[0]):
        n = int(seq_lens[s]) + length_offset
        table = block_tables[s].tolist()
        if n <= 0:
            continue
        rows = [((t // page_size) if logical_pages else table[t // page_size], t % page_size) for t in range(n)]
        k = torch.stack([k_cache[p, r] for p, r in rows]).double()  # [n, KVH, D]
        v = torch.stack([v_cache[p, r] for p, r in rows]).double()
        for h in range(num_heads):
            kh = kv_head_of(h)
            w = torch.softmax((k[:, kh] @ q[s, h].double()) * scale, dim=0)
            out[s, h] = w @ v[:, kh]
    return out


def _hint(case, got) -> str:
    q, k, v, bt, lens, scale = case
    num_heads, num_kv_heads = q.shape[1], k.shape[2]
    alternatives = {
        "no softmax scale (multiply q.k by scale = 1/sqrt(head_dim) before the softmax)":
            dict(scale=1.0),
        "the scale applied twice or squared": dict(scale=scale * scale),
        "the wrong KV head for a query head: with GQA, query head h reads KV head h // (num_heads // num_kv_heads)":
            dict(kv_head_of=lambda h: h % num_kv_heads),
        "one token too few: the query attends to tokens 0 .. seq_lens[s] - 1, its own token included":
            dict(length_offset=-1),
        "one token too many: positions >= seq_lens[s] hold garbage and must be masked out":
            dict(length_offset=1),
        "logical page numbers: token t lives in physical page block_tables[s, t // page_size]":
            dict(logical_pages=True),
    }
    for reason, kwargs in alternatives.items():
        try:
            args = dict(scale=scale)
            args.update(kwargs)
            scale_ = args.pop("scale")
            if args.get("logical_pages") and int(bt.max()) >= k.shape[0]:
                continue
            alt = _oracle(q, k, v, bt, lens, scale_, **args)
        except (IndexError, RuntimeError):
            continue
        if torch.allclose(got.double(), alt, atol=1e-6, rtol=1e-6) and num_heads >= 1:
            return f" It matches attention with {reason}."
    return ""


def _cases(seed: int):
    rng = random.Random(seed)
    return [
        ("GQA (4 query heads, 2 KV heads)", _case(rng, 4, 2, 8, 4, [1, 4, rng.randint(5, 11)])),
        ("MQA (4 query heads, 1 KV head)", _case(rng, 4, 1, 8, 3, [rng.randint(1, 9) for _ in range(3)])),
        ("MHA (2 heads), page_size 1", _case(rng, 2, 2, 4, 1, [rng.randint(1, 6), rng.randint(1, 6)])),
        ("float32 GQA", _case(rng, 6, 2, 16, 4, [rng.randint(2, 12) for _ in range(2)], torch.float32)),
    ]


def _check_attention(name, impl, seed, allow_reference, vectorized):
    with forbid_calls(name, _reference_modules(), enabled=not allow_reference):
        for label, case in _cases(seed):
            q, k, v, bt, lens, scale = case
            snapshot = [t.clone() for t in (q, k, v, bt, lens)]
            shown = (f"{name} on {label}: q {list(q.shape)} {str(q.dtype).replace('torch.', '')}, page_size "
                     f"{k.shape[1]}, seq_lens {lens.tolist()}, block_tables {bt.tolist()}")
            got = call(shown, impl, q, k, v, bt, lens, scale)
            expect(isinstance(got, torch.Tensor), f"{shown}: must return a tensor, got {type(got).__name__}")
            expect(tuple(got.shape) == tuple(q.shape), f"{shown}: output shape must be {list(q.shape)} "
                                                        f"[num_seqs, num_heads, head_dim], got {list(got.shape)}")
            expect(got.dtype == q.dtype, f"{shown}: output dtype must be q's ({q.dtype}), got {got.dtype}")
            for before, after, what in zip(snapshot, (q, k, v, bt, lens), ("q", "k_cache", "v_cache", "block_tables", "seq_lens")):
                expect(torch.equal(before, after), f"{shown}: the function modified its input {what}")
            want = _oracle(q, k, v, bt, lens, scale)
            tol = 1e-9 if q.dtype == torch.float64 else 1e-4
            err = (got.double() - want).abs().max().item()
            if not err <= tol:  # also catches NaN
                bad = (got.double() - want).abs().amax(dim=(1, 2))
                s = int(bad.argmax())
                fail(f"{shown}: wrong output (max error {err:.3g} > {tol:g}, worst on sequence {s} of length "
                     f"{int(lens[s])}).{_hint(case, got)}")
        if vectorized:
            _check_no_token_loop(name, impl, seed)
    # Serve the decode rows of a float64 model through the student's function.
    rng = random.Random(seed)
    model = fixtures.random_model(seed)
    prompts = fixtures.random_prompts(rng, 3, model.config.vocab_size, lo=2, hi=12)
    want = fixtures.greedy(model, prompts, 6)
    engine = LLMEngine(model, EngineConfig(page_size=4, max_num_seqs=4, admission="none"), attention=impl)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"{name} (serving the decode steps of a float64 model)", max_steps=200)
    for i, w in enumerate(want):
        got = engine.requests[f"r{i}"].output_token_ids
        expect(got == w, f"{name}: serving a float64 model's decode steps, request r{i} produced {got} instead of "
                         f"the model's greedy answer {w}")


def _check_no_token_loop(name, impl, seed):
    rng = random.Random(seed + 1)
    small = _case(rng, 4, 2, 8, 4, [5, 7, 6])
    large = _case(rng, 4, 2, 8, 4, [40, 56, 48])
    with count_user_lines() as lines_small:
        impl(*small)
    with count_user_lines() as lines_large:
        impl(*large)
    a, b = lines_small[0], lines_large[0]
    expect(b <= 2 * a + 30,
           f"{name}: with 8x more context tokens your function executed {b} Python lines instead of {a}: it loops "
           "over tokens (or pages) in Python. Gather every sequence's pages with one indexing operation "
           "(k_cache[block_tables]), mask positions >= seq_lens, and softmax over the whole row.")


@check("paged_attention_loops", forbidden=_reference_functions)
def check_paged_attention_loops(impl, seed, allow_reference):
    _check_attention("paged_attention_loops", impl, seed, allow_reference, vectorized=False)


@check("paged_attention_vectorized", forbidden=_reference_functions)
def check_paged_attention_vectorized(impl, seed, allow_reference):
    _check_attention("paged_attention_vectorized", impl, seed, allow_reference, vectorized=True)
