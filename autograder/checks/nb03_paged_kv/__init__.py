"""Checks for notebook 03 (paged KV): the block pool, slot mapping, the flat batch, and the two kinds of
waste.

The pool is checked three ways: a scripted walk through the cases that matter (the last free
page, running out, double free, shared pages), a seeded random sequence of requests arriving,
growing, sharing and leaving (the full state is compared after every operation), and serving a
float64 model through the real engine with the student's pool (greedy tokens must not change).
The flat batch is judged field by field on hand-made steps (mixed decodes and prefill chunks, prefix-cache
hits, page boundaries inside a chunk, padding rows, scattered pages) and on every step of a float64 model
served through `LLMEngine(..., batch_builder=...)` (chunked prefill and prefix caching on, both forwards,
and a static batch with padding rows), whose greedy tokens must equal the dense model's.
"""
from __future__ import annotations

from .build_flat_batch import check_build_flat_batch
from .contiguous_waste import check_contiguous_waste
from .paged_waste import check_paged_waste
from .slot_mapping import check_slot_mapping
from .student_block_pool import check_StudentBlockPool
