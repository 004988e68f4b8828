"""Checks for notebook 01 (static batching): left padding, the naive batched loop with and without
a KV cache, padding waste.

The two loops are held to the same greedy tokens as the plain float64 model AND to the shape of
every forward pass they make (counted at the model's embedding, so `model(...)` and
`model.forward(...)` are both seen): a static batch carries every row in every pass; without a
cache pass k recomputes the whole rectangle `B x (L + k)`; with one, the prefill computes the
padded prompts `B x L` once and every later pass feeds exactly one new token per row.
"""
from __future__ import annotations

from .pad_batch import check_pad_batch
from .padding_waste import check_padding_waste
from .static_generate import check_static_generate
from .static_generate_cached import check_static_generate_cached
