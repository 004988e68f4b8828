"""Roofline cost of one engine step on a named GPU.

A step does some arithmetic and moves some bytes; on a GPU the two overlap, so the step
takes as long as the slower of the two, plus a fixed per-step overhead:

    compute_s = flops / gpu.peak_flops
    memory_s  = bytes / gpu.mem_bandwidth
    total_s   = max(compute_s, memory_s) + overhead_s

    flops = 2 * num_params * (num_tokens + num_padded_tokens)           # every matmul, every row
          + 4 * num_layers * num_heads * head_dim * attention_context_tokens  # QK^T and PV
    bytes = num_params * bytes_per_param                                 # weights, read once per step
          + (kv_tokens_read + kv_tokens_written) * kv_bytes_per_token    # the KV cache

`2 * num_params` per token counts a multiply-add per weight (embeddings included: a slight
overcount that keeps the formula one line). Attention costs `2 * head_dim` FLOPs for q.k and
`2 * head_dim` for p.v, per (query, key) pair, per query head, per layer.

A draft model (speculative decoding) adds its own passes, one after another before the target's:
each runs `draft_layer_fraction` of the target's layers over the drafted rows, so it reads that share
of the weights once per pass and computes that share of a target row's FLOPs and K/V traffic per row:

    draft_s = max(draft_flops / gpu.peak_flops, draft_bytes / gpu.mem_bandwidth)
    total_s = max(compute_s, memory_s) + draft_s + overhead_s

(the share of the embeddings and the LM head is an undercount, as the draft model runs the whole head).

This is where the course's two regimes come from: a decode step reads all the weights to
produce a handful of tokens (memory-bound: adding sequences is nearly free), a big prefill
computes thousands of tokens per weight read (compute-bound: time grows with tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

from course_lib.sim.hardware import GPUSpec, ModelShape, get_gpu, get_model_shape

# Fixed cost of one engine step beyond the GPU's arithmetic and memory traffic: scheduling,
# building the batch's metadata, kernel launches, sampling and the host sync that returns the
# sampled tokens. A Python engine without CUDA graphs spends a few ms here; vLLM V1 with CUDA
# graphs well under 1 ms. 2 ms sits in between, and stops a tiny model from claiming
# microsecond steps (which would hide the point of batching: amortise this per-step cost).
DEFAULT_STEP_OVERHEAD_S = 2e-3


@dataclass(frozen=True)
class RooflineCost:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float
    total_s: float
    bound: str  # "compute" or "memory": which of the two the step waited on (the target's pass)
    draft_s: float = 0.0  # a draft model's passes (in total_s; flops and bytes are the target's pass only)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved; compare with `GPUSpec.ridge_intensity`."""
        return self.flops / self.bytes if self.bytes else 0.0


def roofline_cost(
    gpu: GPUSpec | str,
    shape: ModelShape | str,
    *,
    num_tokens: int,
    num_padded_tokens: int = 0,
    kv_tokens_read: int = 0,
    kv_tokens_written: int = 0,
    attention_context_tokens: int = 0,
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
    draft_rows: int = 0,
    draft_context_tokens: int = 0,
    draft_passes: int = 0,
    draft_layer_fraction: float = 0.0,
) -> RooflineCost:
    """Cost of one step from explicit counts.

    num_tokens: real tokens computed (prefill chunks + decodes).
    num_padded_tokens: extra rows computed only as padding (static batching); charged as FLOPs.
    kv_tokens_read: tokens of KV *fetched from memory*. A decode reads its sequence's whole
        context once. A prefill chunk's queries share their reads (a flash-attention kernel
        streams each key/value tile once per sequence, not once per query), so count each
        sequence's context once, not the per-query sum.
    kv_tokens_written: tokens whose K/V is stored this step (normally num_tokens).
    attention_context_tokens: sum over query tokens of the keys each attends to (the FLOPs
        side, which *does* grow per query).

    draft_rows, draft_context_tokens, draft_passes, draft_layer_fraction: a draft model's work this
        step (`StepStats.draft_model_*`): rows it computed, keys they attended to, its sequential
        passes, and its share of the target's layers (0: no draft model, as n-gram lookup).

    A step with no tokens at all runs no kernels and reads no weights: it costs the overhead.
    """
    gpu, shape = get_gpu(gpu), get_model_shape(shape)
    for label, value in (
        ("num_tokens", num_tokens),
        ("num_padded_tokens", num_padded_tokens),
        ("kv_tokens_read", kv_tokens_read),
        ("kv_tokens_written", kv_tokens_written),
        ("attention_context_tokens", attention_context_tokens),
        ("overhead_s", overhead_s),
        ("draft_rows", draft_rows),
        ("draft_context_tokens", draft_context_tokens),
        ("draft_passes", draft_passes),
        ("draft_layer_fraction", draft_layer_fraction),
    ):
        if value < 0:
            raise ValueError(f"{label} must be >= 0, got {value}")
    if draft_layer_fraction > 1:
        raise ValueError(f"draft_layer_fraction is a share of the target's layers, at most 1, got {draft_layer_fraction}")
    computed_rows = num_tokens + num_padded_tokens
    flops = 2.0 * shape.num_params * computed_rows + 4.0 * shape.num_layers * shape.num_heads * shape.head_dim * (
        attention_context_tokens
    )
    weight_bytes = shape.weight_bytes if computed_rows > 0 else 0.0
    kv_bytes = float(kv_tokens_read + kv_tokens_written) * shape.kv_bytes_per_token
    total_bytes = weight_bytes + kv_bytes
    compute_s = flops / gpu.peak_flops
    memory_s = total_bytes / gpu.mem_bandwidth
    draft_s = 0.0
    if draft_rows and draft_layer_fraction:
        draft_flops = draft_layer_fraction * (2.0 * shape.num_params * draft_rows + 4.0 * shape.num_layers
                                              * shape.num_heads * shape.head_dim * draft_context_tokens)
        draft_bytes = draft_layer_fraction * (max(draft_passes, 1) * shape.weight_bytes
                                              + float(draft_context_tokens + draft_rows) * shape.kv_bytes_per_token)
        draft_s = max(draft_flops / gpu.peak_flops, draft_bytes / gpu.mem_bandwidth)
    return RooflineCost(
        flops=flops,
        bytes=total_bytes,
        compute_s=compute_s,
        memory_s=memory_s,
        overhead_s=float(overhead_s),
        total_s=max(compute_s, memory_s) + draft_s + overhead_s,
        bound="compute" if compute_s >= memory_s and flops > 0 else "memory",
        draft_s=draft_s,
    )


def step_time(gpu: GPUSpec | str, shape: ModelShape | str, stats=None, **counts) -> float:
    """Seconds for one step: of a recorded `StepStats` (`cost_of_step`), or of the explicit
    counts of `roofline_cost` (`num_tokens=...`, ...). `overhead_s` may be given either way."""
    if stats is not None:
        return cost_of_step(stats, gpu, shape, **counts).total_s
    return roofline_cost(gpu, shape, **counts).total_s


def cost_of_step(
    stats,
    gpu: GPUSpec | str,
    shape: ModelShape | str,
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> RooflineCost:
    """Roofline cost of a recorded step (`course_lib.scheduler.output.StepStats` or anything
    with its fields): `context_tokens_read` is the per-sequence KV read (bytes),
    `attention_context_tokens` the per-query sum (FLOPs).
    """
    return roofline_cost(
        gpu,
        shape,
        num_tokens=stats.num_prefill_tokens + stats.num_decode_tokens,
        num_padded_tokens=stats.num_padded_tokens,
        kv_tokens_read=stats.context_tokens_read,
        kv_tokens_written=stats.kv_tokens_written,
        attention_context_tokens=stats.attention_context_tokens,
        overhead_s=overhead_s,
        draft_rows=getattr(stats, "draft_model_rows", 0),
        draft_context_tokens=getattr(stats, "draft_model_context_tokens", 0),
        draft_passes=getattr(stats, "draft_model_passes", 0),
        draft_layer_fraction=getattr(stats, "draft_layer_fraction", 0.0),
    )
