"""What notebook 04's three attention checks share: the inputs (garbage in every slot a sequence does
not own, scales, overflow, GQA/MQA, page edges), the dense float64 oracle and the comparison."""
from __future__ import annotations

import contextlib
import random
import sys

import torch

from autograder import _checking, fixtures
from autograder._checking import (broke, call, count_user_lines, describe_exception, drive, expect,
                                  expect_greedy_answers, expect_unchanged, forbid_calls, is_tensor, kind_of)
from course_lib import EngineConfig, LLMEngine, SamplingParams

GARBAGE = (float("nan"), float("inf"), float("-inf"))


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


def _case(rng: random.Random, num_heads, num_kv_heads, head_dim, page_size, seq_lens, dtype=torch.float64,
          scale=None, q_boost=1.0, table_slack=1, growing=False):
    """Random q and caches; each sequence's pages are scattered over the pool, its table padded
    (`table_slack` extra columns at least) with pages it does not own, and EVERY slot it does not
    own holds NaN / +inf / -inf. The last physical page of the pool is never owned (an unmasked
    read of a few elements past a sequence's last slot stays inside the tensor), and neither is page
    0: a masked load of a block-table entry yields page 0 (`other=0`), so a kernel that then reads
    that page's keys or values without masking them meets garbage, as it would on a real cache. `growing`: the
    keys of each sequence line up more and more with its queries, so the scores grow along the
    sequence (a later block always raises the running maximum)."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    width = max(pages_per_seq) + table_slack
    num_pages = sum(pages_per_seq) + 3
    owned_order = rng.sample(range(1, num_pages - 1), num_pages - 2)  # page 0 and the last page: never owned
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    # Garbage first: a different non-finite value in every neighbouring slot, keys and values offset.
    pattern = torch.tensor(GARBAGE, dtype=torch.float64)
    slots = torch.arange(num_pages * page_size * num_kv_heads * head_dim)
    k_cache = pattern[slots % 3].view(shape).clone()
    v_cache = pattern[(slots + 1) % 3].view(shape).clone()
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen, dtype=torch.float64) * q_boost
    group = num_heads // num_kv_heads
    tables, used = [], 0
    spare = [p for p in range(num_pages) if p not in owned_order[:sum(pages_per_seq)]]
    for s, (n, count) in enumerate(zip(seq_lens, pages_per_seq)):
        pages = owned_order[used:used + count]
        used += count
        for t in range(n):
            k = torch.randn(num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
            if growing:  # k_t leans towards the group's mean query, more for later t
                mean_q = q[s].view(num_kv_heads, group, head_dim).mean(dim=1)
                k = 0.3 * k + (t + 1) / n * mean_q / mean_q.norm(dim=-1, keepdim=True).clamp(min=1e-9) * 3
            k_cache[pages[t // page_size], t % page_size] = k
            v_cache[pages[t // page_size], t % page_size] = torch.randn(num_kv_heads, head_dim, generator=gen,
                                                                        dtype=torch.float64)
        tables.append(pages + [rng.choice(spare) for _ in range(width - count)])
    if scale is None:
        scale = head_dim ** -0.5
    return (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), torch.tensor(tables, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32), float(scale))


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
        k = torch.stack([k_cache[p, r] for p, r in rows]).double().cpu()  # [n, KVH, D]
        v = torch.stack([v_cache[p, r] for p, r in rows]).double().cpu()
        for h in range(num_heads):
            kh = kv_head_of(h)
            w = torch.softmax((k[:, kh] @ q[s, h].double().cpu()) * scale, dim=0)
            out[s, h] = w @ v[:, kh]
    return out


def _hint(case, got) -> str:
    q, k, v, bt, lens, scale = case
    got = got.double().cpu()
    if not torch.isfinite(got).all():
        bad = sorted({int(s) for s in (~torch.isfinite(got)).nonzero()[:, 0].tolist()})
        return (f" Your output holds NaN/inf (sequences {bad}): the slots a sequence does not own hold NaN and "
                "inf here (as on a real cache) and reached the result. Masking the scores is not enough: a zero "
                "weight times a NaN (or inf) value is NaN, so the values of unowned slots must never be read "
                "into the sum either (or the exponentials overflowed: subtract the maximum score first).")
    num_heads, num_kv_heads, head_dim = q.shape[1], k.shape[2], q.shape[2]
    alternatives = {
        f"scale = head_dim ** -0.5 = {head_dim ** -0.5:.4g} instead of the scale argument ({scale:.4g}): use "
        "the argument you are given": dict(scale=head_dim ** -0.5),
        "no softmax scale (multiply q.k by the scale argument before the softmax)": dict(scale=1.0),
        "the scale applied twice or squared": dict(scale=scale * scale),
        "the wrong KV head for a query head: with GQA, query head h reads KV head h // (num_heads // num_kv_heads)":
            dict(kv_head_of=lambda h: h % num_kv_heads),
        "one token too few: the query attends to tokens 0 .. seq_lens[s] - 1, its own token included":
            dict(length_offset=-1),
        "logical page numbers: token t lives in physical page block_tables[s, t // page_size]":
            dict(logical_pages=True),
    }
    for reason, kwargs in alternatives.items():
        args = dict(scale=scale)
        args.update(kwargs)
        scale_ = args.pop("scale")
        if scale_ == scale and "scale" in kwargs:
            continue
        try:
            if args.get("logical_pages") and int(bt.max()) >= k.shape[0]:
                continue
            alt = _oracle(q, k, v, bt, lens, scale_, **args)
        except (IndexError, RuntimeError):
            continue
        if torch.isfinite(alt).all() and torch.allclose(got, alt, atol=1e-4, rtol=1e-4):
            return f" It matches attention with {reason}."
    return ""


BF16_LABEL = ("bfloat16 inputs, 40-60 tokens, head_dim 64, scale 1 (scores of a few units: computed in bfloat16 "
              "they lose about 3 significant digits)")


def _cases(seed: int):
    """(label, case) pairs for the loop and vectorised versions: every edge of the rules."""
    rng = random.Random(seed)
    return [
        ("GQA (4 query heads, 2 KV heads), default scale; seq_len 1, exactly full pages, a partial last page",
         _case(rng, 4, 2, 8, 4, [1, 4, 8, rng.randint(5, 11)])),
        ("MQA (4 query heads, 1 KV head), scale 0.37, pages of 3",
         _case(rng, 4, 1, 8, 3, [rng.randint(1, 9) for _ in range(3)], scale=0.37)),
        ("MHA (2 heads), page_size 1, scale 1.3", _case(rng, 2, 2, 4, 1, [rng.randint(1, 6), rng.randint(1, 6)],
                                                        scale=1.3)),
        ("huge scores (|q.k * scale| in the thousands: exp overflows unless the maximum is subtracted first)",
         _case(rng, 4, 2, 8, 4, [rng.randint(6, 12), 3], scale=1.0, q_boost=400.0)),
        ("float32 GQA, scale 0.21", _case(rng, 6, 2, 16, 4, [rng.randint(2, 12) for _ in range(2)], torch.float32,
                                          scale=0.21)),
        (BF16_LABEL, _case(rng, 4, 2, 64, 4, [rng.randint(40, 60) for _ in range(3)], torch.bfloat16, scale=1.0)),
    ]


def _describe(name, label, case):
    q, k, v, bt, lens, scale = case
    return (f"{name} on {label}: q {list(q.shape)} {str(q.dtype).replace('torch.', '')}, page_size {k.shape[1]}, "
            f"scale {scale:g}, seq_lens {lens.tolist()}, block_tables {bt.tolist()}")


def _compare(name, label, impl, case, tol, watch_table=False):
    """Call impl on case, check shape / dtype / inputs left alone / values against the oracle. A bfloat16
    case is held to the output's own rounding: within one bfloat16 unit of the float64 answer, element by
    element, which float32 arithmetic meets and bfloat16 arithmetic does not."""
    q, k, v, bt, lens, scale = case  # the check's own tensors: the student's code gets copies
    given = [t.clone() for t in (q, k, v, bt, lens)]
    shown = _describe(name, label, case)
    want = _oracle(q, k, v, bt, lens, scale)
    with (_table_reads(given[3], given[4], k.shape[1]) if watch_table else contextlib.nullcontext([])) as reads:
        try:
            got = impl(*given, scale)
        except (NotImplementedError, AssertionError):
            raise
        except Exception as exc:  # noqa: BLE001 - anything the student's code raises
            if isinstance(exc, OverflowError):
                broke("no overflow", f"{shown} raised {describe_exception(exc)}")
            broke("attention as defined", f"{shown} raised {describe_exception(exc)}")
    if reads:
        s, entry = reads[0]
        where = (f"entry {entry} of sequence {s}'s block-table row, which holds no token of it (seq_len "
                 f"{int(lens[s])}, pages of {k.shape[1]})" if s < bt.shape[0] else "memory past the end of block_tables")
        broke("table entries of tokens only",
              f"{shown}: your kernel read {where}: a block's positions past seq_len are not tokens, and their "
              "page numbers must not be loaded either (past the last row that is memory the kernel does not own: "
              "an illegal address on a GPU). Give the page-number load its mask")
    # Bit for bit, NaN and inf included: writing over the garbage of unowned slots (nan_to_num_ on the
    # cache) would defuse the trap this check sets for unmasked values.
    for handed, kept, what in zip(given, (q, k, v, bt, lens), ("q", "k_cache", "v_cache", "block_tables", "seq_lens")):
        expect_unchanged(f"{shown}: the function", what, handed, kept, rule="shape and dtype")
    expect(is_tensor(got), lambda: f"{shown}: must return a tensor, got {kind_of(got)}", rule="shape and dtype")
    expect(tuple(got.shape) == tuple(q.shape), f"{shown}: output shape must be {list(q.shape)} "
                                                f"[num_seqs, num_heads, head_dim], got {list(got.shape)}",
           rule="shape and dtype")
    expect(got.dtype == q.dtype, f"{shown}: output dtype must be q's ({q.dtype}), got {got.dtype}",
           rule="shape and dtype")
    diff = (got.double().cpu() - want).abs().nan_to_num(nan=float("inf"))
    if q.dtype == torch.bfloat16:  # one bfloat16 unit (2^-8 relative, 8 significant bits) of each element
        diff = diff - want.abs() * 2.0 ** -8
    err = diff.max().item()
    if not err <= tol:
        s, h = divmod(int(diff.amax(dim=2).argmax()), diff.shape[1])
        if q.dtype == torch.bfloat16 and torch.isfinite(got).all():
            broke("float32 or wider",
                  f"{shown}: wrong output (worst on sequence {s}, query head {h}: expected "
                  f"{want[s, h, :3].tolist()}..., got {got[s, h, :3].double().tolist()}...; more than one bfloat16 "
                  "unit away). Computed in float32 (or float64) and rounded once at the end, the answer is within "
                  "one unit; in bfloat16 every score, weight and sum loses precision on the way: convert q, K and V "
                  "up first and return q.dtype")
        _broke_value(_value_rule(label, case, got), f"{shown}: wrong output (max error {err:.3g} > {tol:g}, worst on sequence {s} of length {int(lens[s])}, "
             f"query head {h}: expected {want[s, h, :3].tolist()}..., got {got[s, h, :3].double().tolist()}...)."
             f"{_hint(case, got)}")


def _broke_value(rule, message):
    """broke() with each rule spelled out (tests/test_rules_blocks.py reads the names from the source)."""
    {"no overflow": lambda: broke("no overflow", message),
     "online softmax": lambda: broke("online softmax", message),
     "unowned slots count for nothing": lambda: broke("unowned slots count for nothing", message),
     "the scale argument": lambda: broke("the scale argument", message),
     "grouped heads": lambda: broke("grouped heads", message),
     "exactly seq_len tokens": lambda: broke("exactly seq_len tokens", message),
     "physical pages": lambda: broke("physical pages", message),
     }.get(rule, lambda: broke("attention as defined", message))()


def _value_rule(label, case, got) -> str:
    """The rule of the block that a wrong output breaks: the case's own edge, or what the output matches
    (the hint's alternatives)."""
    finite = bool(torch.isfinite(got).all())
    if not finite and ("huge scores" in label or "into the thousands" in label):
        return "no overflow"
    if finite and "running max rises" in label:
        return "online softmax"
    hint = _hint(case, got)
    for words, rule in (("NaN/inf", "unowned slots count for nothing"), ("scale", "the scale argument"),
                        ("KV head", "grouped heads"), ("token too few", "exactly seq_len tokens"),
                        ("logical page", "physical pages")):
        if words in hint:
            return rule
    return "attention as defined"


def _check_attention(name, impl, seed, allow_reference, vectorized):
    with forbid_calls(name, _reference_modules(), enabled=not allow_reference):
        for label, case in _cases(seed):
            _compare(name, label, impl, case, 1e-9 if case[0].dtype == torch.float64 else 1e-4)
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
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name}: serving a float64 model's decode steps, request r{i} produced {got} instead of the model's greedy "
        f"answer {w}"), rule="attention as defined")


def _check_no_token_loop(name, impl, seed):
    """Pages of 2 tokens: the long context has 16x the pages of the short one, so a loop over pages (a
    comprehension included) adds ~60 lines, a loop over tokens ~120; the same 3 sequences in both."""
    rng = random.Random(seed + 1)
    small = _case(rng, 4, 2, 8, 2, [5, 7, 6])
    large = _case(rng, 4, 2, 8, 2, [100, 128, 112])
    with count_user_lines() as lines_small:
        call(f"{name} (3 sequences of 5-7 tokens, 4 pages of 2)", impl, *small)
    with count_user_lines() as lines_large:
        call(f"{name} (3 sequences of 100-128 tokens, 64 pages of 2)", impl, *large)
    a, b = lines_small[0], lines_large[0]
    expect(b <= a + 30,
           f"{name}: with 16x more pages and tokens your function executed {b} Python lines instead of {a}: it loops "
           "over tokens or pages in Python (a comprehension counts too). Gather every sequence's pages with one "
           "indexing operation, mask the positions a sequence does not own, and softmax over the whole row.",
           rule="no loop over pages")


@contextlib.contextmanager
def _table_reads(block_tables, seq_lens, page_size):
    """The (sequence, entry) pairs of `block_tables` that the Triton interpreter loaded in the block
    although they hold no token of the sequence (entry * page_size >= seq_len), or past the tensor's
    end (sequence = num_seqs). A kernel that masks its page-number load never reads them; one that
    does not is harmless here (K and V masked) but reads memory it does not own on a GPU. Recorded as
    plain data (the student's code runs in the sandbox; the replay reads the record)."""
    from autograder.recording.active import active_membrane

    active = active_membrane()
    with _checking._hooked("table_reads", [], _checking._fill_list) as reads:
        if active is not None and active.mode == "replay":
            yield reads
            return
        with _watch_table_loads(block_tables, seq_lens, page_size, reads):
            yield reads


@contextlib.contextmanager
def _watch_table_loads(block_tables, seq_lens, page_size, reads):
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    num_seqs, width = block_tables.shape
    base, item = block_tables.data_ptr(), block_tables.element_size()
    end = base + (num_seqs + 1) * width * item  # one row past the end: where an unmasked read lands
    needed = [-(-int(n) // page_size) for n in seq_lens.tolist()]
    original = builder.create_masked_load

    def create_masked_load(ptrs, mask, other, *args, **kwargs):
        if len(reads) < 20:
            addresses = np.asarray(ptrs.data).astype(np.uint64).ravel()
            active = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
            inside = addresses[active & (addresses >= base) & (addresses < end)]
            for index in sorted({(int(a) - base) // item for a in inside.tolist()}):
                s, entry = divmod(index, width)
                if s >= num_seqs or entry >= needed[s]:
                    reads.append((s, entry))
        return original(ptrs, mask, other, *args, **kwargs)

    builder.create_masked_load = create_masked_load
    try:
        yield
    finally:
        del builder.create_masked_load  # the class's own method again
