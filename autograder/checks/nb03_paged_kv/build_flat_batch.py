"""Notebook 03, `build_flat_batch`: one step's SchedulerOutput as the runner's tensors, field by field
on hand-made steps and on every step of a float64 model served through it."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import (REFERENCE_MESSAGE, broke, call, check, drive, expect, expect_greedy_answers,
                                  expect_unchanged, fail, is_tensor, kind_of, pristine, watch_calls)
from course_lib import EngineConfig, LLMEngine, SamplingParams

from ._shared import _slots

_LONG_FIELDS = ("token_ids", "positions", "slot_mapping")  # one entry per row, int64


_INT_FIELDS = ("block_tables", "seq_lens", "query_start_loc")  # per sequence, int32


_FIELDS = _LONG_FIELDS + _INT_FIELDS


def _flat_batch_function():
    from course_lib.runner_batch import build_flat_batch

    return (build_flat_batch,)


def _flat_batch_modules():
    """What the student's builder may not run: course_lib's builder and its slot maps, the request's
    `slots()` among them (reading the ScheduledRequest's fields is fine: the rest of its module is not
    watched)."""
    import course_lib.kv.page_table as page_table
    import course_lib.kv.slots as slots
    import course_lib.runner_batch as runner_batch
    from course_lib.scheduler.output import ScheduledRequest

    return [runner_batch, slots, page_table, ScheduledRequest.slots]


# What the builder may use of those modules: `FlatBatch`, the class its answer must be (the notebook imports
# it), `num_tokens` included; it computes none of the rows.
FLAT_BATCH_HELPERS = ("course_lib.runner_batch:FlatBatch",)


def _entry(rid, start, n, page_ids, rng=None, tokens=None, vocab=61):
    from course_lib.scheduler.output import ScheduledRequest

    if tokens is None:
        tokens = [rng.randrange(3, vocab) if rng else (7 * (start + i) + 5 * len(page_ids)) % 50 + 3 for i in range(n)]
    return ScheduledRequest(rid, n, start, samples=True, token_ids=tokens, page_ids=tuple(page_ids),
                            sampling_params=SamplingParams(max_tokens=4))


def _output(entries, pad=0):
    from course_lib.scheduler.output import SchedulerOutput

    # The runner hands the builder its entries with the single-token ones first.
    entries = sorted(entries, key=lambda s: s.num_new_tokens > 1)
    return SchedulerOutput(scheduled=entries, num_padded_tokens=pad, num_running=len(entries))


def _describe(out, page_size, pad_slot) -> str:
    parts = [f"{out.num_padded_tokens} padding row(s)"] if out.num_padded_tokens else []
    for s in out.scheduled:
        where = (f"position {s.start}" if s.num_new_tokens == 1 else
                 f"positions {s.start}..{s.start + s.num_new_tokens - 1}")
        parts.append(f"{s.request_id}: {s.num_new_tokens} new token(s) {s.token_ids} at {where}, page_ids {s.page_ids}")
    return f"page_size={page_size}, pad_slot={pad_slot}, rows in order: " + "; ".join(parts)


def _expected_batch(out, page_size, pad_slot) -> dict:
    """What every field must hold, as nested lists (the check's own oracle)."""
    pad = out.num_padded_tokens
    want = {"token_ids": [0] * pad, "positions": [0] * pad, "slot_mapping": [pad_slot] * pad,
            "block_tables": [[pad_slot // page_size] for _ in range(pad)], "seq_lens": [1] * pad,
            "query_start_loc": list(range(pad + 1))}
    for s in out.scheduled:
        want["token_ids"] += s.token_ids
        want["positions"] += list(s.positions)
        want["slot_mapping"] += _slots(s.page_ids, page_size, s.start, s.num_new_tokens)
        want["block_tables"].append(list(s.page_ids))
        want["seq_lens"].append(s.start + s.num_new_tokens)
        want["query_start_loc"].append(want["query_start_loc"][-1] + s.num_new_tokens)
    width = max(len(t) for t in want["block_tables"])
    want["block_tables"] = [t + [0] * (width - len(t)) for t in want["block_tables"]]
    return want


def _hint(field, got, want, out, page_size, pad_slot) -> str:
    """A pointer to the likely mistake, for the patterns students really produce."""
    pad, entries = out.num_padded_tokens, out.scheduled
    news = [1] * pad + [s.num_new_tokens for s in entries]
    starts = [0] * pad + [s.start for s in entries]
    if field == "positions":
        if got == [p + 1 for p in want]:
            return " Off by one: an entry's first new token sits at position `start`."
        if got == [0] * pad + [i for s in entries for i in range(s.num_new_tokens)]:
            return (" Each entry's tokens start at position `start`, not 0: the tokens before it are already in "
                    "the cache (an earlier chunk, or a prefix-cache hit).")
    if field == "slot_mapping":
        if got[pad:] == _positions(out)[pad:]:
            return (" Those are token positions: a slot is where the position lives in the pool, through the "
                    "entry's page_ids (your slot_mapping of section 2).")
        if got[:pad] != want[:pad]:
            return f" The padding rows write to pad_slot ({pad_slot}): any other slot may belong to a request."
    if field == "seq_lens":
        if got == news:
            return (" seq_lens counts every token the sequence attends to: the ones already in the cache (`start`) "
                    "plus its new ones, not only the new ones.")
        if got == starts:
            return " A new token attends to itself too: seq_lens is start + num_new_tokens."
    if field == "query_start_loc":
        if len(got) == len(want) - 1:
            return (" It needs one offset more than there are sequences: 0 first, then where each sequence's rows "
                    "end (the last one is the number of rows).")
    if field == "block_tables" and pad and len(got) == len(want) - pad:
        return " Each padding row is a sequence of its own (one token that reads only itself)."
    if field in ("token_ids", "positions", "slot_mapping") and sorted(map(str, got)) == sorted(map(str, want)):
        return (" The right rows in the wrong order: padding rows first, then the entries in the order of "
                "output.scheduled (the runner reads each sampled token from its entry's last row).")
    return ""


def _positions(out) -> list[int]:
    return [0] * out.num_padded_tokens + [p for s in out.scheduled for p in s.positions]


def _broke_flat(rule, message):
    """broke() with each rule spelled out (tests/test_rules_blocks.py reads the names from the source)."""
    {"row order": lambda: broke("row order", message),
     "positions and slots": lambda: broke("positions and slots", message),
     "padding rows": lambda: broke("padding rows", message),
     "one sequence each": lambda: broke("one sequence each", message),
     }.get(rule, lambda: broke("tensor contract", message))()


def _field_rule(field, hint: str) -> str:
    """The rule of the notebook's block that a wrong value of `field` breaks."""
    if "in the wrong order" in hint:
        return "row order"
    if "padding row" in hint or "pad_slot" in hint:
        return "padding rows"
    return "positions and slots" if field in _LONG_FIELDS else "one sequence each"


def _tensor_problem(field, t, want, rows, seqs, pad, device="cpu") -> tuple[str, str] | None:
    """(rule, problem) when `t` breaks the tensor contract or has the wrong shape, else None."""
    import torch

    if not is_tensor(t):
        return "tensor contract", f"{field} must be a torch.Tensor, got {kind_of(t)}"
    if t.device.type != torch.device(device).type:
        return "tensor contract", (f"{field} is on {t.device}, expected the device argument {device!r}: build "
                                   "each tensor on `device` (the engine passes the one its model runs on)")
    dtype = torch.long if field in _LONG_FIELDS else torch.int32
    if t.dtype != dtype:
        return "tensor contract", (f"{field} is {t.dtype}, expected {dtype} (token ids, positions and slots are int64; block tables, "
                "sequence lengths and offsets int32: the attention kernels and the cpu forward read them as such)")
    shape = [len(want), len(want[0])] if field == "block_tables" else [len(want)]
    if list(t.shape) != shape:
        what = {"token_ids": f"one per row: {rows} rows", "positions": f"one per row: {rows} rows",
                "slot_mapping": f"one per row: {rows} rows", "seq_lens": f"one per sequence: {seqs} sequences",
                "query_start_loc": f"one more than the {seqs} sequences",
                "block_tables": f"one row per sequence ({seqs}), as wide as the longest page table ({shape[-1]})"}
        hint = ""
        if field == "query_start_loc" and list(t.shape) == [seqs]:
            hint = (" It needs one offset more than there are sequences: 0 first, then where each sequence's rows "
                    "end (the last one is the number of rows).")
        elif field in _INT_FIELDS and pad and t.dim() >= 1 and t.shape[0] in (seqs - pad, seqs - pad + 1):
            hint = " Each padding row is a sequence of its own (one token that reads only itself)."
        rule = "padding rows" if "padding row" in hint else _field_rule(field, hint)
        return rule, f"{field} has shape {list(t.shape)}, expected {shape} ({what[field]}).{hint}"
    if not t.is_contiguous():
        return "tensor contract", (f"{field} is not contiguous (strides {t.stride()}): the cpu forward reads its memory directly; "
                "build it contiguous (or call .contiguous())")
    return None


def _judge_batch(got, out, want, page_size, pad_slot, where: str) -> None:
    """Fail unless `got` is exactly `want`, the flat batch of `out` (the check's own, never handed over)."""
    shown = f"build_flat_batch{where} for the step ({_describe(out, page_size, pad_slot)})"
    missing = [f for f in _FIELDS if not hasattr(got, f)]
    expect(not missing, lambda: f"{shown} returned {kind_of(got)} without {', '.join(missing)}: return a "
                                "FlatBatch (from course_lib.runner_batch import FlatBatch)", rule="tensor contract")
    rows, seqs = len(want["token_ids"]), len(want["seq_lens"])
    for field in _FIELDS:
        t = getattr(got, field)
        problem = _tensor_problem(field, t, want[field], rows, seqs, out.num_padded_tokens)
        if problem:
            _broke_flat(problem[0], f"{shown}: {problem[1]}")
        values = t.tolist()
        if values != want[field]:
            hint = _hint(field, values, want[field], out, page_size, pad_slot)
            _broke_flat(_field_rule(field, hint), f"{shown}: {field} = {values}, expected {want[field]}.{hint}")


def _call_builder(impl, shown, given, page_size, device, pad_slot, allow_reference):
    """The student's builder called on `given`; calls into course_lib's builder or slot maps are refused."""
    if allow_reference:
        return call(shown, impl, given, page_size, device, pad_slot)
    hits = []
    try:
        with watch_calls(_flat_batch_modules(), allowed=FLAT_BATCH_HELPERS) as hits:
            return call(shown, impl, given, page_size, device, pad_slot)
    finally:  # read once the watch has closed: on the grader's replay that is when the record fills it in
        used = [f"{m}.{f}" for m, f in hits]
        if used:
            fail(f"build_flat_batch {REFERENCE_MESSAGE} (it calls {used[0]}): compute the rows yourself "
                 "(your slot_mapping of section 2 gives the slots)")


def _build(impl, out, page_size, device, pad_slot, where, allow_reference):
    """The student's batch of `out`, judged: the expected batch is computed from `out` first, and the
    student's code is handed a copy of it (`out` may be the engine's own, which the runner reads next)."""
    want = _expected_batch(out, page_size, pad_slot)
    shown = f"build_flat_batch{where} ({_describe(out, page_size, pad_slot)})"
    given = pristine(out)
    got = _call_builder(impl, shown, given, page_size, device, pad_slot, allow_reference)
    expect_unchanged(shown, "output", given, out, rule="inputs unchanged")
    _judge_batch(got, out, want, page_size, pad_slot, where)
    return got


def _fixed_outputs():
    """(output, page_size, pad_slot): the cases that matter, written out."""
    e = _entry
    return [
        # the notebook's worked example: two decodes, a prefill chunk crossing a page boundary (8)
        (_output([e("r0", 9, 1, [7, 3, 5], tokens=[18]), e("r1", 4, 1, [2, 8], tokens=[33]),
                  e("r2", 6, 5, [0, 6, 9], tokens=[12, 40, 7, 7, 21])]), 4, 40),
        # a static batch's decode step: padding rows (finished passengers) first
        (_output([e("r0", 5, 1, [3, 1]), e("r1", 2, 1, [6])], pad=2), 4, 48),
        # a prefix-cache hit (the chunk starts at 8) beside a fresh prompt; no decode
        (_output([e("r0", 8, 3, [5, 1, 11]), e("r1", 0, 7, [3, 10])]), 4, 48),
        # page size 1, and a lone prompt in pages of 16
        (_output([e("r0", 3, 1, [4, 0, 9, 2]), e("r1", 1, 3, [7, 5, 8, 1])]), 1, 10),
        (_output([e("r0", 0, 20, [2, 0])]), 16, 48),
    ]


def _random_output(rng):
    page_size = rng.choice([2, 4, 8])
    n_decodes = rng.randint(0, 3)
    n_chunks = rng.randint(0 if n_decodes else 1, 3)
    shapes = []
    for i in range(n_decodes + n_chunks):
        n = 1 if i < n_decodes else rng.randint(2, 3 * page_size)
        start = rng.choice([0, page_size * rng.randint(1, 3), rng.randint(1, 4 * page_size)])
        shapes.append((start, n, -(-(start + n) // page_size)))
    num_pages = sum(need for _, _, need in shapes) + rng.randint(0, 6)
    free = rng.sample(range(num_pages), num_pages)  # scattered page ids
    entries = [_entry(f"r{i}", start, n, [free.pop() for _ in range(need)], rng)
               for i, (start, n, need) in enumerate(shapes)]
    pad = rng.choice([0, 0, 1, 3]) if n_chunks == 0 else 0
    return _output(entries, pad), page_size, num_pages * page_size  # the scratch page after the pool


def _serve_through_builder(impl, seed, allow_reference, config, label):
    """A float64 model served with the student's builder; each batch is judged, then the tokens."""
    rng = random.Random(300 + seed)
    model = fixtures.random_model(seed)
    vocab = model.config.vocab_size
    systems = [[rng.randrange(3, vocab) for _ in range(rng.choice([8, 9, 11]))] for _ in range(2)]
    prompts = [systems[i % 2] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for i in range(6)]
    want = fixtures.greedy(model, prompts, 6)
    calls = [0]

    def builder(out, page_size, device, pad_slot):
        calls[0] += 1
        where = f" (engine step {calls[0]}, {label})"
        return _build(impl, out, page_size, device, pad_slot, where, allow_reference)

    engine = LLMEngine(model, config, batch_builder=builder)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"build_flat_batch ({label})", max_steps=300)
    expect(calls[0] > 0, f"build_flat_batch ({label}): the engine never called the builder")
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"build_flat_batch ({label}): request r{i} (prompt {prompts[i]}) produced {got} instead of the model's "
        f"greedy answer {w}"))
    return engine


@check("build_flat_batch", forbidden=_flat_batch_function)
def check_build_flat_batch(impl, seed, allow_reference):
    expect(callable(impl), f"build_flat_batch must be a function, got {type(impl).__name__}")
    rng = random.Random(seed)
    cases = _fixed_outputs() + [_random_output(rng) for _ in range(8)]
    for out, page_size, pad_slot in cases:
        _build(impl, out, page_size, "cpu", pad_slot, "", allow_reference)
    # "auto" is the C forward where it can run here, else the PyTorch one: either way the steps (and so the
    # questions this check asks) are the same, which a recorded grading replayed elsewhere relies on.
    for forward in ("eager", "auto"):
        config = EngineConfig(page_size=4, num_pages=20, max_num_seqs=4, max_num_batched_tokens=10, admission="none",
                              enable_chunked_prefill=True, enable_prefix_caching=True, forward=forward)
        engine = _serve_through_builder(impl, seed, allow_reference, config,
                                        f"chunked prefill and prefix caching, forward={forward!r}")
        expect(engine.prefix_cache.hit_tokens > 0, "internal: the prefix-caching run never hit the cache")
    static = EngineConfig(page_size=4, num_pages=40, max_num_seqs=4, scheduler="static", admission="none",
                          forward="auto")
    engine = _serve_through_builder(impl, seed, allow_reference, static, "static batching (padding rows)")
    expect(sum(s.num_padded_tokens for s in engine.step_stats) > 0, "internal: the static run had no padding row")
