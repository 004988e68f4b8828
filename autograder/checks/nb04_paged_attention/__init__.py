"""Checks for notebook 04 (paged attention): decode attention through block tables.

Each implementation is compared with a dense float64 oracle (gather the sequence's tokens in
order, softmax(q k^T * scale) v, query head h reading KV head h // group). The inputs reach the
edges the notebook states as rules:

- every slot a sequence does not own (the rest of its last page, the pages its table is padded
  with, every other page of the pool) holds NaN, +inf or -inf, in the keys AND the values: a
  version that masks the scores but multiplies garbage values by a zero weight outputs NaN
  (0 * nan = nan, 0 * inf = nan);
- a `scale` other than head_dim ** -0.5 (the argument is the scale; never recompute it);
- scores so large that exp() overflows without subtracting the maximum first;
- GQA and MQA (query head h reads KV head h // group), MHA with pages of one token;
- seq_len 1, sequences that end exactly on a page boundary, and a partial last page.

The loop and vectorised versions then serve the decode rows of a float64 model in the real
engine (greedy tokens must not change); the vectorised one may not loop over tokens (the Python
lines it executes may not grow with the context length). The Triton kernel runs in Triton's CPU
interpreter (or on the GPU when there is one) on small float32 shapes: its scores grow along the
sequence across several blocks of BLOCK_N tokens, so an online softmax that forgets to rescale
its running sums when the maximum grows is caught. In the interpreter one more case runs on bfloat16
inputs: its answer is not compared (the interpreter cannot compute in bfloat16), the dtype of every
rounding operation the kernel runs is (float32 or wider).
"""
from __future__ import annotations

from .paged_attention_loops import check_paged_attention_loops
from .paged_attention_triton import check_paged_attention_triton, triton_device
from .paged_attention_vectorized import check_paged_attention_vectorized
