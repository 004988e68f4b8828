"""`python -m course_lib bench attention`: paged decode attention, side by side with contiguous SDPA.

For each (batch, context) every sequence has `context` cached tokens and one new query (a decode
step), with 32 query heads sharing 8 KV heads of head_dim 128, in pages of 16 tokens handed out
in a random order (a fragmented pool). Backends:

- **sdpa**: `F.scaled_dot_product_attention(..., enable_gqa=True)` on a *contiguous* copy of the
  same keys and values (`[batch, kv_heads, context, head_dim]`, K/V not repeated per query
  head): the speed paged attention is trying to match.
- **torch**: `course_lib.attention` "torch" backend (vectorised gather through the block table),
  called the way the engine calls it: with the step's plan (which slots to gather, what to mask)
  made once per step and shared by every layer, so it is not in the per-call time, just as
  FlashInfer's `plan` is not. The plan's own time is the **torch_plan** column: a step pays it
  once for all layers (32 of them in Llama-3-8B).
- **triton**: the Triton kernel (split-KV chosen automatically). On the CPU it runs in the
  interpreter, so it is only measured when asked for (`--backends ... triton`).
- **flashinfer** / **flash_attn**: when importable (FlashInfer reads our paged cache directly;
  flash-attn's paged mode needs pages of 256 tokens, so it gets the contiguous cache).

Reported per configuration: the median time per call after warm-up (CUDA events on a GPU,
`perf_counter` on the CPU; on a GPU the L2 cache is flushed before every call, since a real step
never finds a layer's KV in L2), the achieved bandwidth (bytes of K, V, Q and O moved / time)
as a fraction of the device-to-device copy bandwidth measured in the same run, and time ratios.
Backends run interleaved, call by call, and each ratio is the median of per-call ratios, so a
shared, noisy machine moves both sides of a ratio together. Each backend's output is checked
against SDPA's (the max abs error goes to the JSON), because a fast wrong kernel is no result.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
GPU_DEFAULTS = dict(batch=[1, 8, 64, 256], context=[512, 4096, 16384], dtype="bfloat16")
CPU_DEFAULTS = dict(batch=[1, 8], context=[128, 512], dtype="float32")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
ALL_BACKENDS = ("sdpa", "torch", "cpu", "triton", "flashinfer", "flash_attn")
# Time ratios each row reports (a/b below 1: a is faster), in table order.
RATIOS = (("torch", "sdpa"), ("cpu", "sdpa"), ("cpu", "torch"), ("triton", "sdpa"), ("triton", "torch"),
          ("triton", "flashinfer"), ("triton", "flash_attn"))
NOT_ATTENTION = ("torch_plan",)  # timed alongside, but per step rather than per layer: no bandwidth


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m course_lib bench attention", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=_csv_ints, help="batch sizes, e.g. 1,8,64 (default: 1,8,64,256 on CUDA; 1,8 on CPU)")
    p.add_argument("--context", type=_csv_ints,
                   help="cached tokens per sequence (default: 512,4096,16384 on CUDA; 128,512 on CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--iters", type=int, default=None, help="timed calls per backend (default: 50 CUDA, 20 CPU)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per backend first (compiles Triton)")
    p.add_argument("--backends", default=None,
                   help=f"comma list from {','.join(ALL_BACKENDS)} (default: all that apply; cpu only on "
                        "the CPU, triton and the libraries only on CUDA)")
    p.add_argument("--heads", type=int, default=NUM_HEADS)
    p.add_argument("--kv-heads", type=int, default=NUM_KV_HEADS)
    p.add_argument("--head-dim", type=int, default=HEAD_DIM)
    p.add_argument("--page-size", type=int, default=PAGE_SIZE)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as one JSON object")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------- inputs
def make_inputs(batch, context, heads, kv_heads, head_dim, page_size, dtype, device, seed=0):
    """A decode batch over a paged cache whose pages are handed out in a random order, plus the
    same keys and values as one contiguous `[batch, kv_heads, context, head_dim]` tensor for SDPA."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = math.ceil(context / page_size)
    num_pages = batch * pages_per_seq
    k = torch.randn(batch, kv_heads, context, head_dim, generator=gen, device=device, dtype=dtype)
    v = torch.randn(batch, kv_heads, context, head_dim, generator=gen, device=device, dtype=dtype)
    k_cache = torch.zeros(num_pages, page_size, kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    order = torch.randperm(num_pages, generator=gen, device=device)
    block_tables = order.view(batch, pages_per_seq).to(torch.int32)
    t = torch.arange(context, device=device)
    for s in range(batch):  # one sequence at a time: no temporary the size of the whole cache
        slots = block_tables[s, t // page_size].long() * page_size + t % page_size
        k_cache.view(-1, kv_heads, head_dim)[slots] = k[s].transpose(0, 1)
        v_cache.view(-1, kv_heads, head_dim)[slots] = v[s].transpose(0, 1)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, head_dim, generator=gen, device=device, dtype=dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens, k=k, v=v,
                scale=head_dim ** -0.5)


def bytes_moved(batch, context, heads, kv_heads, head_dim, dtype) -> int:
    """The bytes a decode step must move at least: read K, V and Q, write O."""
    elem = torch.tensor([], dtype=dtype).element_size()
    return elem * (2 * batch * context * kv_heads * head_dim + 2 * batch * heads * head_dim)


def _fits(batch, context, kv_heads, head_dim, dtype, device) -> str | None:
    """None if the paged cache and its contiguous copy fit in device memory, else the reason."""
    elem = torch.tensor([], dtype=dtype).element_size()
    need = 4 * batch * context * kv_heads * head_dim * elem  # paged K, V + contiguous K, V
    need += 2 * batch * context * head_dim * 4 * 2  # torch backend: one KV head's K and V in fp32
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need > 0.85 * free:
            return f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return None


# ------------------------------------------------------------------------------------- backends
def make_backends(inputs, names, device, context):
    """{name: zero-argument callable} for every requested backend that can run here; and
    {name: reason} for those that cannot."""
    q, k_cache, v_cache = inputs["q"], inputs["k_cache"], inputs["v_cache"]
    bt, lens, scale = inputs["block_tables"], inputs["seq_lens"], inputs["scale"]
    fns, unavailable = {}, {}
    for name in names:
        try:
            if name == "sdpa":
                q4 = q[:, :, None]  # [B, H, 1, D]
                fns[name] = lambda q4=q4: F.scaled_dot_product_attention(
                    q4, inputs["k"], inputs["v"], scale=scale, enable_gqa=True)[:, :, 0]
            elif name == "torch":
                from ..attention.torch_paged import paged_decode_torch, plan_decode

                plan = plan_decode(k_cache, bt, lens)
                fns[name] = lambda: paged_decode_torch(q, k_cache, v_cache, bt, lens, scale, plan=plan)
                fns["torch_plan"] = lambda: plan_decode(k_cache, bt, lens)
            elif name == "cpu":
                from ..attention.cpu_decode import paged_decode_cpu, plan_decode_cpu

                cpu_plan = plan_decode_cpu(k_cache, bt, lens)  # made once per step in the engine
                fns[name] = lambda: paged_decode_cpu(q, k_cache, v_cache, bt, lens, scale, plan=cpu_plan)
            elif name == "triton":
                from ..attention.triton_decode import paged_decode_triton

                # max_seq_len from the host (as an engine knows it) avoids a device sync per call.
                fns[name] = lambda: paged_decode_triton(q, k_cache, v_cache, bt, lens, scale, max_seq_len=context)
            elif name == "flashinfer":
                fns[name] = _flashinfer_decode(inputs)
            elif name == "flash_attn":
                fns[name] = _flash_attn_decode(inputs)
        except Exception as err:  # an optional library that is missing or refuses this shape
            unavailable[name] = f"{type(err).__name__}: {err}"[:120]
    return fns, unavailable


def _flashinfer_decode(inputs):
    import flashinfer

    q, k_cache, v_cache, bt, lens = (inputs[n] for n in ("q", "k_cache", "v_cache", "block_tables", "seq_lens"))
    page_size, kv_heads, head_dim = k_cache.shape[1:]
    pages = (lens + page_size - 1) // page_size
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = pages.cumsum(0)
    indices = torch.cat([bt[s, :int(n)] for s, n in enumerate(pages.tolist())]).to(torch.int32)
    last_page_len = ((lens - 1) % page_size + 1).to(torch.int32)
    workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    args = (indptr, indices, last_page_len, q.shape[1], kv_heads, head_dim, page_size)
    if hasattr(wrapper, "plan"):
        wrapper.plan(*args, pos_encoding_mode="NONE", q_data_type=q.dtype, kv_data_type=k_cache.dtype,
                     sm_scale=inputs["scale"])
        return lambda: wrapper.run(q, (k_cache, v_cache))
    wrapper.begin_forward(*args, pos_encoding_mode="NONE", data_type=q.dtype)  # older FlashInfer
    return lambda: wrapper.forward(q, (k_cache, v_cache), sm_scale=inputs["scale"])


def _flash_attn_decode(inputs):
    from flash_attn import flash_attn_with_kvcache

    q, lens = inputs["q"], inputs["seq_lens"]
    # flash-attn's paged mode wants pages of 256 tokens; give it the contiguous cache instead,
    # as [B, context, kv_heads, head_dim] views (no copy).
    k, v = inputs["k"].transpose(1, 2), inputs["v"].transpose(1, 2)
    return lambda: flash_attn_with_kvcache(q[:, None], k, v, cache_seqlens=lens,
                                           softmax_scale=inputs["scale"])[:, 0]


# --------------------------------------------------------------------------------------- timing
class _Timer:
    """Times one call: CUDA events on a GPU (after flushing L2), perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            self.flush = torch.empty(512 * 2**20, dtype=torch.uint8, device=device)
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def __call__(self, fn) -> float:
        if self.cuda:
            self.flush.zero_()  # evict the previous call's K/V from L2
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1e3
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start


def copy_bandwidth(device, nbytes=None) -> float:
    """Bytes/s of a large device-to-device tensor copy (read + write both counted): the ceiling
    that a memory-bound kernel is measured against."""
    cuda = torch.device(device).type == "cuda"
    nbytes = nbytes or (2 * 2**30 if cuda else 64 * 2**20)  # well past any L2 (and this CPU's L3)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timer = _Timer(device)
    for _ in range(3):
        dst.copy_(src)
    times = [timer(lambda: dst.copy_(src)) for _ in range(10 if cuda else 5)]
    del src, dst
    return 2 * nbytes / statistics.median(times)


def measure(fns, device, iters, warmup):
    """{name: [seconds per call]}, backends interleaved call by call."""
    timer = _Timer(device)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    times = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            times[name].append(timer(fn))
    return times


def run_config(batch, context, args, dtype, names, copy_bw):
    row = dict(batch=batch, context=context)
    reason = _fits(batch, context, args.kv_heads, args.head_dim, dtype, args.device)
    if reason:
        return dict(row, skipped=reason)
    try:
        return _run_config(row, batch, context, args, dtype, names, copy_bw)
    except torch.cuda.OutOfMemoryError:
        return dict(row, skipped="out of memory")
    finally:
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()


def _run_config(row, batch, context, args, dtype, names, copy_bw):
    cuda = torch.device(args.device).type == "cuda"
    inputs = make_inputs(batch, context, args.heads, args.kv_heads, args.head_dim, args.page_size, dtype,
                         args.device, args.seed)
    fns, unavailable = make_backends(inputs, names, args.device, context)
    expected = fns["sdpa"]().float() if "sdpa" in fns else None
    errors = {}
    for name, fn in list(fns.items()):
        if name in NOT_ATTENTION:
            continue
        try:
            out = fn()
            if expected is not None:
                errors[name] = float((out.float() - expected).abs().max())
        except Exception as err:  # e.g. out of memory for the gather-based torch backend
            unavailable[name] = f"{type(err).__name__}: {err}"[:120]
            del fns[name]
            if cuda:
                torch.cuda.empty_cache()
    iters = args.iters or (50 if cuda else 20)
    times = measure(fns, args.device, iters, args.warmup)
    nbytes = bytes_moved(batch, context, args.heads, args.kv_heads, args.head_dim, dtype)
    med = {name: statistics.median(t) for name, t in times.items()}

    def ratio(a, b):  # median of per-call ratios: robust to a noisy, shared machine
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    row.update(
        bytes=nbytes,
        time_us={name: t * 1e6 for name, t in med.items()},
        bandwidth_gbs={name: nbytes / t / 1e9 for name, t in med.items() if name not in NOT_ATTENTION},
        bandwidth_frac_of_copy={name: nbytes / t / copy_bw for name, t in med.items() if name not in NOT_ATTENTION},
        ratio={f"{a}/{b}": ratio(a, b) for a, b in RATIOS if a in times and b in times},
        max_abs_err_vs_sdpa=errors,
        unavailable=unavailable,
    )
    if "triton" in fns:
        from ..attention.triton_decode import choose_num_splits, num_sms

        row["triton_splits"] = choose_num_splits(batch, args.kv_heads, context, num_sms(args.device))
    return row


# ---------------------------------------------------------------------------------------- table
def format_table(rows, names) -> str:
    """One plain table: times, bandwidth as a fraction of copy bandwidth, and time ratios
    (below 1: the first backend is faster)."""
    ratio_keys = [f"{a}/{b}" for a, b in RATIOS if any(f"{a}/{b}" in r.get("ratio", {}) for r in rows)]
    header = (["batch", "context"] + [f"{n} us" for n in names]
              + [f"{n} %copy" for n in names if n != "sdpa" and n not in NOT_ATTENTION]
              + ["sdpa %copy"] + ratio_keys + (["splits"] if "triton" in names else []))
    lines = []
    for r in rows:
        if "skipped" in r:
            lines.append([str(r["batch"]), str(r["context"]), f"skipped: {r['skipped']}"])
            continue
        cells = [str(r["batch"]), str(r["context"])]
        cells += [f"{r['time_us'][n]:.1f}" if n in r["time_us"] else "-" for n in names]
        frac = r["bandwidth_frac_of_copy"]
        cells += [f"{100 * frac[n]:.1f}%" if n in frac else "-" for n in names if n != "sdpa" and n not in NOT_ATTENTION]
        cells += [f"{100 * frac['sdpa']:.1f}%" if "sdpa" in frac else "-"]
        cells += [f"{r['ratio'][k]:.2f}" if k in r["ratio"] else "-" for k in ratio_keys]
        if "triton" in names:
            cells.append(str(r.get("triton_splits", "-")))
        lines.append(cells)
    widths = [max(len(h), *(len(line[i]) for line in lines if len(line) == len(header))) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [fmt(header), "  ".join("-" * w for w in widths)]
    out += [fmt(line) if len(line) == len(header) else "  ".join(line) for line in lines]
    return "\n".join(out)


def device_name(device) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = torch.get_num_threads()
    return f"CPU ({model}, {threads} torch thread{'s' if threads != 1 else ''})"


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("CUDA is not available; use --device cpu", file=sys.stderr)
        return 2
    defaults = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    batches, contexts = args.batch or defaults["batch"], args.context or defaults["context"]
    dtype = DTYPES[args.dtype or defaults["dtype"]]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backends:
        names = [n.strip() for n in args.backends.split(",") if n.strip()]
        unknown = set(names) - set(ALL_BACKENDS)
        if unknown:
            print(f"unknown backends {sorted(unknown)}; choose from {ALL_BACKENDS}", file=sys.stderr)
            return 2
    else:
        names = ["sdpa", "torch"] + (["triton", "flashinfer", "flash_attn"] if cuda else ["cpu"])

    from tqdm.auto import tqdm

    copy_bw = copy_bandwidth(args.device)
    configs = [(b, c) for b in batches for c in contexts]
    rows = []
    for batch, context in tqdm(configs, desc="attention configs", file=sys.stderr):
        rows.append(run_config(batch, context, args, dtype, names, copy_bw))
    ran = [n for n in list(names) + list(NOT_ATTENTION) if any(n in r.get("time_us", {}) for r in rows)]
    title = (f"paged decode attention on {device_name(args.device)}, {str(dtype).replace('torch.', '')}, "
             f"{args.heads} query heads / {args.kv_heads} KV heads, head_dim {args.head_dim}, page {args.page_size}; "
             f"copy bandwidth {copy_bw / 1e9:.1f} GB/s")
    print(title)
    print(format_table(rows, ran))
    missing = {n: r for row in rows for n, r in row.get("unavailable", {}).items()}
    for name, reason in missing.items():
        print(f"  {name}: not measured ({reason})")
    if args.json:
        result = dict(
            benchmark="attention", device=device_name(args.device), device_type=torch.device(args.device).type,
            dtype=str(dtype).replace("torch.", ""), torch=torch.__version__,
            date=datetime.date.today().isoformat(), copy_bandwidth_gbs=copy_bw / 1e9,
            shape=dict(num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                       page_size=args.page_size),
            backends=ran, results=rows,
        )
        try:
            import triton

            result["triton"] = triton.__version__
        except ImportError:
            pass
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
