"""Speculative decoding on the roofline: when does drafting k tokens per decode pay?

A decode step of B requests at context L computes B rows without speculation. With k drafts
each it computes B (1 + k) rows: every request's last token and its k guesses, checked in one
forward pass. What the step moves barely changes: the weights are read once per step, and each
sequence's K/V is read once (a flash-attention kernel streams a sequence's keys once for all of
its queries), only L + 1 + k tokens instead of L + 1. What it computes grows 1 + k times.

So while decode is memory-bound (few requests), a drafted step costs about what a plain one
does and yields E = 1 + a + a^2 + ... + a^k tokens per request, where a is the chance that the
target keeps a draft given that it kept the ones before (`expected_tokens_per_step`): TPOT
falls by nearly E. Once B (1 + k) rows make the step compute-bound, its time grows with the
rows while the tokens kept grow only with E, and speculation costs throughput.
`crossing_batch` finds the batch where it stops paying.

The counts here are the ones `LLMEngine` records for such a step (`StepStats`): a drafted row
adds 1 + k to `num_decode_tokens` and `kv_tokens_written`, reads its context plus 1 + k tokens
of K/V (`context_tokens_read`), and its i-th query attends to L + i keys
(`attention_context_tokens`). Drafting is free with n-gram lookup (`draft_layer_fraction=0`, the
default); a draft model that runs a share f of the target's layers adds k passes of one row per
request before the target's (`StepStats.draft_model_*`, priced by `course_lib.sim.roofline`): k reads
of f of the weights, which a memory-bound decode pays in full, so speculation with a draft model pays
less, and stops paying at a smaller batch, than with n-gram lookup at the same acceptance rate.
"""
from __future__ import annotations

from course_lib.engine_config import EngineConfig
from course_lib.sim.hardware import GPUSpec, ModelShape
from course_lib.sim.roofline import DEFAULT_STEP_OVERHEAD_S, RooflineCost, roofline_cost

# EngineConfig's defaults, and the simulator's: 3 drafts per decode, each kept with probability 0.7
# by the scripted runner (given the earlier ones were kept). vLLM's n-gram and EAGLE set-ups use k of 2 to 5.
DEFAULT_NUM_SPECULATIVE_TOKENS = EngineConfig.num_speculative_tokens
DEFAULT_ACCEPTANCE_RATE = EngineConfig.spec_acceptance_rate


def expected_tokens_per_step(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """Tokens a drafted request gains per step: 1 + a + ... + a^k (the kept drafts, stopping at the
    first miss, plus the target's own token), for per-draft acceptance `a` and `k` drafts."""
    if not 0.0 <= acceptance_rate <= 1.0:
        raise ValueError(f"acceptance_rate must be within [0, 1], got {acceptance_rate}")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
    return sum(acceptance_rate ** i for i in range(num_speculative_tokens + 1))


def decode_step_counts(batch: int, context: int, num_speculative_tokens: int = 0,
                       draft_layer_fraction: float = 0.0) -> dict:
    """The `StepStats` counts of a step in which `batch` requests, each with `context` tokens of K/V
    already cached, decode one token and `num_speculative_tokens` drafts each (as LLMEngine records them),
    with the draft model's own work when it runs `draft_layer_fraction` of the target's layers."""
    if batch < 0 or context < 0 or num_speculative_tokens < 0:
        raise ValueError(f"batch, context and num_speculative_tokens must be >= 0, got "
                         f"{batch}, {context}, {num_speculative_tokens}")
    n, k = 1 + num_speculative_tokens, num_speculative_tokens
    drafting = bool(k and draft_layer_fraction)
    return {
        "num_decode_tokens": batch * n,
        "num_draft_tokens": batch * k,
        "context_tokens_read": batch * (context + n),  # once per sequence, not once per query
        "kv_tokens_written": batch * n,  # the rejected drafts' K/V is written too (and later overwritten)
        "attention_context_tokens": batch * (n * context + n * (n + 1) // 2),  # query i sees context + i keys
        # The draft model's k passes: pass j computes one row per request at position context + j (the last
        # kept token, then each guess), attending to context + 1 + j keys (DraftModelDrafter.take_work).
        "draft_model_rows": batch * k if drafting else 0,
        "draft_model_context_tokens": batch * (k * (context + 1) + k * (k - 1) // 2) if drafting else 0,
        "draft_model_passes": k if drafting else 0,
        "draft_layer_fraction": draft_layer_fraction if drafting else 0.0,
    }


def decode_step_cost(batch: int, context: int, num_speculative_tokens: int = 0, gpu: GPUSpec | str = "H100",
                     shape: ModelShape | str = "llama-3-8b",
                     overhead_s: float = DEFAULT_STEP_OVERHEAD_S, draft_layer_fraction: float = 0.0) -> RooflineCost:
    """Roofline cost of that step (`decode_step_counts`) on `gpu` for a model of `shape`."""
    c = decode_step_counts(batch, context, num_speculative_tokens, draft_layer_fraction)
    return roofline_cost(gpu, shape, num_tokens=c["num_decode_tokens"], kv_tokens_read=c["context_tokens_read"],
                         kv_tokens_written=c["kv_tokens_written"],
                         attention_context_tokens=c["attention_context_tokens"], overhead_s=overhead_s,
                         draft_rows=c["draft_model_rows"], draft_context_tokens=c["draft_model_context_tokens"],
                         draft_passes=c["draft_model_passes"], draft_layer_fraction=c["draft_layer_fraction"])


def compare_decode(batch: int, context: int, num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
                   acceptance_rate: float = DEFAULT_ACCEPTANCE_RATE, gpu: GPUSpec | str = "H100",
                   shape: ModelShape | str = "llama-3-8b", overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
                   draft_layer_fraction: float = 0.0) -> dict:
    """A steady decode of `batch` requests at `context`, without and with speculation: per side the
    step time, tokens per request per step, TPOT, throughput and which roofline bound the step hit;
    `gain` is the throughput ratio (with / without; below 1 speculation costs throughput).
    `draft_layer_fraction`: 0 for n-gram lookup (free drafts), else the draft model's share of the layers."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    out = {"batch": batch, "context": context, "num_speculative_tokens": num_speculative_tokens,
           "acceptance_rate": acceptance_rate}
    for side, k in (("plain", 0), ("speculative", num_speculative_tokens)):
        cost = decode_step_cost(batch, context, k, gpu, shape, overhead_s, draft_layer_fraction)
        tokens = expected_tokens_per_step(acceptance_rate, k)
        out[side] = {"step_s": cost.total_s, "tokens_per_step": tokens, "tpot_s": cost.total_s / tokens,
                     "throughput_tok_s": batch * tokens / cost.total_s, "bound": cost.bound}
    out["gain"] = out["speculative"]["throughput_tok_s"] / out["plain"]["throughput_tok_s"]
    return out


def crossing_batch(context: int, num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
                   acceptance_rate: float = DEFAULT_ACCEPTANCE_RATE, gpu: GPUSpec | str = "H100",
                   shape: ModelShape | str = "llama-3-8b", overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
                   max_batch: int = 8192, draft_layer_fraction: float = 0.0) -> int | None:
    """The smallest batch (up to `max_batch`) at which speculation no longer raises throughput
    (`compare_decode(...)["gain"] <= 1`), or None if it still pays at `max_batch`."""
    for batch in range(1, max_batch + 1):
        if compare_decode(batch, context, num_speculative_tokens, acceptance_rate, gpu, shape,
                          overhead_s, draft_layer_fraction)["gain"] <= 1.0:
            return batch
    return None

