"""The slot mapping: where the K/V of token positions live in the pool's flat storage.

A page table lists a request's physical pages in logical order; position p sits in the table's
entry p // page_size, at row p % page_size, and the storage numbers slots page by page, so its
slot is page * page_size + row. Notebook 3's exercise of the same name is held to this.

This is the one place the formula is written: `PageTable.slot` / `PageTable.slots` (a table the
KV manager owns) and `ScheduledRequest.slots` (the runner's slot mapping of a step) call it, so
the slots the manager hands out and the slots the runner writes K/V at cannot drift apart. (The
attention backends and kernels compute the same map on tensors, vectorised, in their own code.)
"""
from __future__ import annotations

from collections.abc import Sequence


def slot_mapping(block_table: Sequence[int], page_size: int, start: int, count: int) -> list[int]:
    return [block_table[p // page_size] * page_size + p % page_size for p in range(start, start + count)]
