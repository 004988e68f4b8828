"""Realistic wrong answers for notebook 03 (paged KV). Self-contained: no autograder imports."""
from course_lib.kv.block_pool import OutOfPages


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
        for page in pages:
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"double free of page {page}")
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


MUTANTS = {
    "StudentBlockPool": [FreeNeverReturnsPage, FreeIgnoresOtherOwners, RefcountNotDecremented, CannotTakeLastPage,
                         PartialAllocation, ShareLeavesPageFree, NoDoubleFreeCheck, NeverEvicts, EvictsEveryPage,
                         EvictsOnFree, SharedFreePageStaysCached],
    "slot_mapping": [slots_are_positions, slots_drop_last, slots_ignore_start, slots_page_index_as_offset],
    "paged_waste": [paged_waste_extra_page, paged_waste_in_pages, paged_waste_empty_holds_page],
    "contiguous_waste": [contiguous_waste_uses_longest, contiguous_waste_forgets_filled, contiguous_waste_off_by_one],
}
