"""`python -m course_lib bench forward`: one engine step through the C forward and through the
PyTorch model, same batch, same caches, side by side.

`EngineConfig.forward` chooses between them: "cpu" runs the whole step in one C call
(model/cpu_forward.py), "eager" runs transformer.py with the runner's PagedAttend (attention by
the "cpu" backend's kernel, as "auto" would pick). The cases go from a one-token decode of the
tiny model, where dispatching ~200 PyTorch ops is nearly all of the time, to a long prompt chunk
of a bigger random model, where the products dominate and torch's batched attention wins (so
"auto" runs such steps eagerly). Each case also reports how far the two logits are apart.
"""
from __future__ import annotations

import time

import torch

from ..model.config import ModelConfig
from ..model.cpu_forward import CpuForward
from ..model.transformer import Transformer
from ..runner import PagedAttend, backend_functions

# A bigger random model: hidden 512, 8 layers, 8 query / 2 KV heads of 64, vocab 32,000.
MEDIUM = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
              num_kv_heads=2, head_dim=64, max_position_embeddings=4096)
# (name, model: "tiny" or "medium", contexts: one (cached tokens, new tokens) per sequence)
CASES = [
    ("tiny, 1 decode", "tiny", [(24, 1)]),
    ("tiny, 10 decodes", "tiny", [(24, 1)] * 10),
    ("tiny, 64 decodes", "tiny", [(40, 1)] * 64),
    ("tiny, 32 prompts of 16", "tiny", [(0, 16)] * 32),
    ("medium, 8 decodes", "medium", [(100, 1)] * 8),
    ("medium, 32 decodes", "medium", [(100, 1)] * 32),
    ("medium, 8 prompts of 64", "medium", [(0, 64)] * 8),
    ("medium, 512 after 1000 cached", "medium", [(1000, 512)]),
]


def make_step(model, contexts, page_size: int = 16, seed: int = 0, padding_rows: int = 0):
    """One engine step built by hand: sequence s has contexts[s] = (cached, new) tokens, its pages
    scattered over the pool, its cached keys and values random; unowned slots hold NaN (a correct
    forward never reads them). Sequences whose chunk is one token should come first (the runner's
    order). Returns (caches: k for every layer, then v; the batch as CpuForward's keyword
    arguments; the number of leading one-token rows, padding included)."""
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-(c + n) // page_size) for c, n in contexts]
    num_pages = sum(pages_per_seq) + 3  # + spare pages, the last one the scratch page for padding
    shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [torch.full(shape, float("nan"), dtype=model.dtype) for _ in range(2 * cfg.num_layers)]
    order = torch.randperm(num_pages - 1, generator=gen).tolist()
    scratch, tables, ids, positions, slots, seq_lens, starts, rows = num_pages - 1, [], [], [], [], [], [0], []
    for _ in range(padding_rows):  # static batching's padding: position 0, the scratch page
        tables.append([scratch])
        ids.append(0), positions.append(0), slots.append(scratch * page_size), seq_lens.append(1)
        starts.append(starts[-1] + 1)
    for (cached, new), n_pages in zip(contexts, pages_per_seq):
        table, order = order[:n_pages], order[n_pages:]
        where = torch.tensor([table[t // page_size] * page_size + t % page_size for t in range(cached)],
                             dtype=torch.long)
        for c in caches:  # the already-cached tokens' keys and values
            c.view(-1, *c.shape[2:])[where] = torch.randn(cached, *c.shape[2:], generator=gen, dtype=c.dtype)
        tables.append(table)
        ids += torch.randint(0, cfg.vocab_size, (new,), generator=gen).tolist()
        positions += range(cached, cached + new)
        slots += [table[t // page_size] * page_size + t % page_size for t in range(cached, cached + new)]
        seq_lens.append(cached + new)
        starts.append(starts[-1] + new)
        rows.append(starts[-1] - 1)
    width = max(len(t) for t in tables)
    batch = dict(
        ids=torch.tensor(ids), positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [scratch] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        logits_rows=torch.tensor(rows),
    )
    leading_decodes = next((i for i, (_, n) in enumerate(contexts) if n > 1), len(contexts))
    return caches, batch, padding_rows + leading_decodes


def eager_step(model, caches, batch, num_decodes: int, backend: str = "torch") -> torch.Tensor:
    """The same step through the PyTorch model and the runner's PagedAttend."""
    L = model.config.num_layers
    meta = {k: batch[k] for k in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc")}
    meta["num_decodes"] = num_decodes
    decode_fn, prefill_fn = backend_functions(backend, "cpu")
    attend = PagedAttend(caches[:L], caches[L:], meta, decode_fn, prefill_fn, model.config.head_dim**-0.5)
    with torch.inference_mode():
        return model(batch["ids"], batch["positions"], attend, logits_indices=batch["logits_rows"])


def _model(kind: str) -> Transformer:
    if kind == "tiny":
        from .engine import load_model

        return load_model("tiny")[0]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**MEDIUM)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def _calls_per_timing(fn, min_seconds: float = 0.05) -> int:
    """How many calls of `fn` make one timing of at least `min_seconds` (after a warm-up call)."""
    fn()
    start = time.perf_counter()
    fn()
    return max(1, int(min_seconds / max(time.perf_counter() - start, 1e-6)))


def _ms_per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def bench_forward(cases=CASES, repeats: int = 5, threads: int | None = 1) -> dict:
    """C vs eager for each case: best-of-`repeats` milliseconds, interleaved, and their ratio."""
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        models, rows = {}, []
        for name, kind, contexts in cases:
            if kind not in models:
                models[kind] = _model(kind)
            model = models[kind]
            caches, batch, num_decodes = make_step(model, contexts)
            for c in caches:  # the eager path's gathers read whole pages: no NaN for timing
                c.nan_to_num_(0.0)
            L = model.config.num_layers
            forward = CpuForward(model, caches[:L], caches[L:])

            def c_step():
                return forward(**batch)

            def eager():
                return eager_step(model, caches, batch, num_decodes, "cpu")

            c_calls, eager_calls = _calls_per_timing(c_step), _calls_per_timing(eager)
            c_ms, eager_ms = [], []
            for _ in range(repeats):  # interleaved: a busy minute slows both sides
                c_ms.append(_ms_per_call(c_step, c_calls))
                eager_ms.append(_ms_per_call(eager, eager_calls))
            diff = float((c_step() - eager()).abs().max())
            rows.append({"case": name, "tokens": int(batch["ids"].shape[0]), "c_ms": min(c_ms),
                         "eager_ms": min(eager_ms), "ratio": min(c_ms) / min(eager_ms), "max_logit_diff": diff})
        return {"threads": torch.get_num_threads(), "repeats": repeats, "cases": rows}
    finally:
        torch.set_num_threads(old_threads)


def format_table(result: dict) -> str:
    lines = [f"one engine step, C forward vs eager (PyTorch model + cpu attention), {result['threads']} thread(s), "
             f"best of {result['repeats']} interleaved", ""]
    header = f"{'case':<32} {'tokens':>6} {'C ms':>9} {'eager ms':>9} {'C / eager':>9} {'max |logit diff|':>17}"
    lines += [header, "-" * len(header)]
    for r in result["cases"]:
        lines.append(f"{r['case']:<32} {r['tokens']:>6} {r['c_ms']:>9.2f} {r['eager_ms']:>9.2f} {r['ratio']:>9.2f} "
                     f"{r['max_logit_diff']:>17.2e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m course_lib bench forward", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    parser.add_argument("--tiny-only", action="store_true", help="skip the medium model (builds in ~2 s, "
                                                                 "its cases take ~1 min)")
    parser.add_argument("--json", help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    from ..model.cpu_forward import available

    ok, why = available()
    if not ok:
        parser.error(f"the C forward cannot run here: {why}")
    cases = [c for c in CASES if c[1] == "tiny"] if args.tiny_only else CASES
    result = bench_forward(cases, args.repeats, args.threads or None)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0
