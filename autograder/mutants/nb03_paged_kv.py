"""Realistic wrong answers for notebook 03 (paged KV). Self-contained: no autograder imports."""
import torch

from course_lib.kv.block_pool import OutOfPages
from course_lib.runner_batch import FlatBatch


class _Pool:
    """A correct pool; each mutant below breaks one rule of it."""

    def __init__(self, num_pages, page_size):
        self.num_pages, self.page_size = num_pages, page_size
        self.ref_counts = [0] * num_pages
        self._free = dict.fromkeys(range(num_pages))
        self.on_evict = None
        self.is_cached = lambda page: False

    @property
    def num_free_pages(self):
        return len(self._free)

    def is_free(self, page):
        return page in self._free

    def allocate(self, n):
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        pages = []
        for _ in range(n):
            page = next(iter(self._free))
            del self._free[page]
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def share(self, page):
        if self.ref_counts[page] == 0:
            del self._free[page]
        self.ref_counts[page] += 1

    def free(self, pages):
        for page in set(pages):
            if self.ref_counts[page] < pages.count(page):
                raise RuntimeError(f"double free of page {page}")
        for page in pages:
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None


class FreeNotAtomic(_Pool):
    """Checks each page as it frees it: a double free found half-way raises after the pages before it
    were already released (the books change although the call failed)."""

    def free(self, pages):
        for page in pages:
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None


class FreeDuplicatesPassValidation(_Pool):
    """Validates the whole list first (all or nothing), but page by page: a page listed twice with one
    owner passes the check, and its count goes to -1."""

    def free(self, pages):
        if any(self.ref_counts[page] <= 0 for page in pages):
            raise RuntimeError("double free")
        for page in pages:
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None


class FreeNeverReturnsPage(_Pool):
    """free() drops the reference but never puts the page back on the free list."""

    def free(self, pages):
        for page in pages:
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
            self.ref_counts[page] -= 1


class FreeIgnoresOtherOwners(_Pool):
    """free() returns a page to the free list at once, even if another request shares it."""

    def free(self, pages):
        for page in pages:
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
            self.ref_counts[page] = 0
            self._free[page] = None


class RefcountNotDecremented(_Pool):
    """free() puts a page with one owner back on the free list but forgets to decrement its count."""

    def free(self, pages):
        for page in pages:
            if self.ref_counts[page] <= 0 or page in self._free:
                raise RuntimeError(f"double free of page {page}")
            if self.ref_counts[page] == 1:
                self._free[page] = None


class CannotTakeLastPage(_Pool):
    """Off by one: refuses to hand out the last free page."""

    def allocate(self, n):
        if n >= len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        return super().allocate(n)


class PartialAllocation(_Pool):
    """Takes pages one by one and only notices it ran out half way (the pages taken are lost)."""

    def allocate(self, n):
        pages = []
        for _ in range(n):
            if not self._free:
                raise OutOfPages("out of pages")
            page = next(iter(self._free))
            del self._free[page]
            self.ref_counts[page] = 1
            pages.append(page)
        return pages


class ShareLeavesPageFree(_Pool):
    """share() of a free (cached) page leaves it on the free list: it is evicted while in use."""

    def share(self, page):
        self.ref_counts[page] += 1


class NoDoubleFreeCheck(_Pool):
    """Accepts freeing a page twice (the free list gets it twice, the count goes negative)."""

    def free(self, pages):
        for page in pages:
            self.ref_counts[page] -= 1
            if self.ref_counts[page] <= 0:
                self._free[page] = None


class NeverEvicts(_Pool):
    """Hands a cached page out again without telling the prefix cache (on_evict never called)."""

    def allocate(self, n):
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        pages = []
        for _ in range(n):
            page = next(iter(self._free))
            del self._free[page]
            self.ref_counts[page] = 1
            pages.append(page)
        return pages


class EvictsEveryPage(_Pool):
    """Calls on_evict for every page it hands out, cached or not."""

    def allocate(self, n):
        pages = super().allocate(n)
        if self.on_evict is not None:
            for page in pages:
                self.on_evict(page)
        return pages


class EvictsOnFree(_Pool):
    """Evicts a cached page as soon as its last owner frees it: nothing survives to be hit later."""

    def free(self, pages):
        super().free(pages)
        for page in pages:
            if self.ref_counts[page] == 0 and self.on_evict is not None and self.is_cached(page):
                self.on_evict(page)


class SharedFreePageStaysCached(_Pool):
    """share() of a free cached page takes it off the free list only if it was never cached."""

    def share(self, page):
        if self.ref_counts[page] == 0 and not self.is_cached(page):
            del self._free[page]
        self.ref_counts[page] += 1


def slots_are_positions(block_table, page_size, start, count):
    """Returns the token positions, never looking at the block table."""
    return list(range(start, start + count))


def slots_drop_last(block_table, page_size, start, count):
    """Off by one: one slot short."""
    return [block_table[p // page_size] * page_size + p % page_size for p in range(start, start + count - 1)]


def slots_ignore_start(block_table, page_size, start, count):
    """Maps positions 0 .. count - 1 whatever the start."""
    return [block_table[p // page_size] * page_size + p % page_size for p in range(count)]


def slots_page_index_as_offset(block_table, page_size, start, count):
    """Uses the page index where the offset inside the page belongs."""
    return [block_table[p // page_size] * page_size + p // page_size for p in range(start, start + count)]


def paged_waste_extra_page(num_tokens_per_request, page_size):
    """n // page_size + 1 pages: one page too many when the last page is exactly full."""
    return sum((n // page_size + 1) * page_size - n for n in num_tokens_per_request)


def paged_waste_in_pages(num_tokens_per_request, page_size):
    """Counts pages (rounded), not slots."""
    return sum(-(-n // page_size) for n in num_tokens_per_request) - sum(n // page_size for n in num_tokens_per_request)


def paged_waste_empty_holds_page(num_tokens_per_request, page_size):
    """Gives a request with no tokens a page anyway."""
    return sum(max(1, -(-n // page_size)) * page_size - n for n in num_tokens_per_request)


def contiguous_waste_uses_longest(num_tokens_per_request, max_len):
    """Reserves the longest request's length instead of max_len."""
    longest = max(num_tokens_per_request)
    return sum(longest - n for n in num_tokens_per_request)


def contiguous_waste_forgets_filled(num_tokens_per_request, max_len):
    """Reports the whole reservation as waste."""
    return len(num_tokens_per_request) * max_len


def contiguous_waste_off_by_one(num_tokens_per_request, max_len):
    """max_len - n - 1 per request."""
    return sum(max_len - n - 1 for n in num_tokens_per_request)


def _flat_lists(output, page_size, pad_slot):
    """A correct flat batch as plain lists; each mutant below breaks one rule of it."""
    pad = output.num_padded_tokens
    rows = {"token_ids": [0] * pad, "positions": [0] * pad, "slot_mapping": [pad_slot] * pad,
            "block_tables": [[pad_slot // page_size] for _ in range(pad)], "seq_lens": [1] * pad,
            "query_start_loc": list(range(pad + 1))}
    for s in output.scheduled:
        rows["token_ids"] += s.token_ids
        rows["positions"] += list(range(s.start, s.start + s.num_new_tokens))
        rows["slot_mapping"] += [s.page_ids[p // page_size] * page_size + p % page_size
                                 for p in range(s.start, s.start + s.num_new_tokens)]
        rows["block_tables"].append(list(s.page_ids))
        rows["seq_lens"].append(s.start + s.num_new_tokens)
        rows["query_start_loc"].append(rows["query_start_loc"][-1] + s.num_new_tokens)
    return rows


def _flat_tensors(rows, device, block_dtype=torch.int32):
    width = max(len(t) for t in rows["block_tables"])
    tables = [t + [0] * (width - len(t)) for t in rows["block_tables"]]
    long, i32 = torch.long, torch.int32
    return FlatBatch(token_ids=torch.tensor(rows["token_ids"], dtype=long, device=device),
                     positions=torch.tensor(rows["positions"], dtype=long, device=device),
                     slot_mapping=torch.tensor(rows["slot_mapping"], dtype=long, device=device),
                     block_tables=torch.tensor(tables, dtype=block_dtype, device=device),
                     seq_lens=torch.tensor(rows["seq_lens"], dtype=i32, device=device),
                     query_start_loc=torch.tensor(rows["query_start_loc"], dtype=i32, device=device))


def flat_positions_off_by_one(output, page_size, device="cpu", pad_slot=0):
    """Positions start at start + 1 (the first new token is taken to follow the cached ones)."""
    rows = _flat_lists(output, page_size, pad_slot)
    pad = output.num_padded_tokens
    rows["positions"] = rows["positions"][:pad] + [p + 1 for p in rows["positions"][pad:]]
    return _flat_tensors(rows, device)


def flat_positions_from_zero(output, page_size, device="cpu", pad_slot=0):
    """Every entry's positions count from 0, ignoring start (later chunks and prefix-cache hits)."""
    rows = _flat_lists(output, page_size, pad_slot)
    rows["positions"] = [0] * output.num_padded_tokens + [i for s in output.scheduled for i in range(s.num_new_tokens)]
    return _flat_tensors(rows, device)


def flat_slot_from_logical_page(output, page_size, device="cpu", pad_slot=0):
    """The slot of a position is computed from its logical page (its index in the table), not the page id."""
    rows = _flat_lists(output, page_size, pad_slot)
    pad = output.num_padded_tokens
    rows["slot_mapping"] = rows["slot_mapping"][:pad] + [(p // page_size) * page_size + p % page_size
                                                         for p in rows["positions"][pad:]]
    return _flat_tensors(rows, device)


def flat_query_start_loc_missing_last(output, page_size, device="cpu", pad_slot=0):
    """query_start_loc holds each sequence's first row only: the final offset (the number of rows) is missing."""
    rows = _flat_lists(output, page_size, pad_slot)
    rows["query_start_loc"] = rows["query_start_loc"][:-1]
    return _flat_tensors(rows, device)


def flat_seq_lens_new_tokens(output, page_size, device="cpu", pad_slot=0):
    """seq_lens counts only the new tokens of the step, not the ones already in the cache."""
    rows = _flat_lists(output, page_size, pad_slot)
    rows["seq_lens"] = [1] * output.num_padded_tokens + [s.num_new_tokens for s in output.scheduled]
    return _flat_tensors(rows, device)


def flat_seq_lens_context_only(output, page_size, device="cpu", pad_slot=0):
    """seq_lens counts the tokens cached before the step (start), forgetting the new ones."""
    rows = _flat_lists(output, page_size, pad_slot)
    rows["seq_lens"] = [1] * output.num_padded_tokens + [s.start for s in output.scheduled]
    return _flat_tensors(rows, device)


def flat_prefills_first(output, page_size, device="cpu", pad_slot=0):
    """Re-sorts the entries, longest chunk first, instead of keeping the order the runner handed in (decodes first)."""
    from dataclasses import replace

    ordered = sorted(output.scheduled, key=lambda s: -s.num_new_tokens)
    return _flat_tensors(_flat_lists(replace(output, scheduled=ordered), page_size, pad_slot), device)


def flat_padding_writes_slot_zero(output, page_size, device="cpu", pad_slot=0):
    """Padding rows write to slot 0 (a page some request may own) instead of pad_slot."""
    rows = _flat_lists(output, page_size, pad_slot)
    pad = output.num_padded_tokens
    rows["slot_mapping"][:pad] = [0] * pad
    rows["block_tables"][:pad] = [[0] for _ in range(pad)]
    return _flat_tensors(rows, device)


def flat_padding_without_sequences(output, page_size, device="cpu", pad_slot=0):
    """Padding rows are in the token rows but are not sequences: no block-table row, length or offset of their own."""
    rows = _flat_lists(output, page_size, pad_slot)
    pad = output.num_padded_tokens
    rows["block_tables"] = rows["block_tables"][pad:]
    rows["seq_lens"] = rows["seq_lens"][pad:]
    rows["query_start_loc"] = rows["query_start_loc"][pad:]
    return _flat_tensors(rows, device)


def flat_block_tables_int64(output, page_size, device="cpu", pad_slot=0):
    """block_tables as torch.long (the default integer type), not int32."""
    return _flat_tensors(_flat_lists(output, page_size, pad_slot), device, block_dtype=torch.long)


def flat_block_tables_column_major(output, page_size, device="cpu", pad_slot=0):
    """Builds block_tables column by column and transposes it: right values, but not contiguous."""
    batch = _flat_tensors(_flat_lists(output, page_size, pad_slot), device)
    batch.block_tables = batch.block_tables.T.contiguous().T
    return batch



def flat_clears_the_step(output, page_size, device="cpu", pad_slot=0):
    """The right batch, then `output.scheduled.clear()` (the step is done with, it thinks): the runner
    reads that step after the builder returns, and finds it empty."""
    batch = _flat_tensors(_flat_lists(output, page_size, pad_slot), device)
    output.scheduled.clear()
    return batch

MUTANTS = {
    "StudentBlockPool": [FreeNeverReturnsPage, FreeNotAtomic, FreeDuplicatesPassValidation, FreeIgnoresOtherOwners, RefcountNotDecremented, CannotTakeLastPage,
                         PartialAllocation, ShareLeavesPageFree, NoDoubleFreeCheck, NeverEvicts, EvictsEveryPage,
                         EvictsOnFree, SharedFreePageStaysCached],
    "slot_mapping": [slots_are_positions, slots_drop_last, slots_ignore_start, slots_page_index_as_offset],
    "paged_waste": [paged_waste_extra_page, paged_waste_in_pages, paged_waste_empty_holds_page],
    "contiguous_waste": [contiguous_waste_uses_longest, contiguous_waste_forgets_filled, contiguous_waste_off_by_one],
    "build_flat_batch": [flat_positions_off_by_one, flat_positions_from_zero, flat_slot_from_logical_page,
                         flat_query_start_loc_missing_last, flat_seq_lens_new_tokens, flat_seq_lens_context_only,
                         flat_prefills_first, flat_padding_writes_slot_zero, flat_padding_without_sequences,
                         flat_block_tables_int64, flat_block_tables_column_major, flat_clears_the_step],
}
