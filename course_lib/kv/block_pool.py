"""The KV memory's bookkeeping: a fixed pool of page ids, a free queue and reference counts.

It holds no tensors: the model runner allocates the K/V storage, one pair of tensors per layer
of `[num_pages, page_size, num_kv_heads, head_dim]`, and a page id here is an index into them.
Requests never own memory, only page ids.

Free pages wait in one queue that doubles as the prefix cache's LRU: a page whose contents
are still worth keeping (it carries a prefix-cache key) goes to the *back* when freed, a
blank page to the *front*. Allocation takes from the front, so blank pages are reused first
and cached pages are evicted least-recently-freed first, and only when the pool needs room.
"""
from __future__ import annotations

from collections import Counter, OrderedDict


class OutOfPages(RuntimeError):
    """Asked for more pages than are free. The scheduler prevents this; seeing it is a bug."""


class BlockPool:
    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages >= 1 and page_size >= 1, got {num_pages} and {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.ref_counts = [0] * num_pages
        self._free: OrderedDict[int, None] = OrderedDict((p, None) for p in range(num_pages))
        # Set by the prefix cache: called with a page id when a cached page is about to be reused.
        self.on_evict = None
        self.is_cached = lambda page: False

    # -- questions --------------------------------------------------------------------------
    @property
    def num_free_pages(self) -> int:
        """Pages that can be handed out now (blank ones plus cached ones nobody is using)."""
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        return self.num_pages - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def is_free(self, page: int) -> bool:
        return page in self._free

    # -- actions ----------------------------------------------------------------------------
    def allocate(self, n: int = 1) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages but only {len(self._free)} of {self.num_pages} are free")
        pages = []
        for _ in range(n):
            page, _ = self._free.popitem(last=False)
            if self.on_evict is not None and self.is_cached(page):
                self.on_evict(page)  # its old contents are about to be overwritten
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def share(self, page: int) -> None:
        """One more owner for `page` (a prefix-cache hit). A free cached page is taken off the queue."""
        if self.ref_counts[page] == 0:
            del self._free[page]
        self.ref_counts[page] += 1

    def free(self, pages: list[int]) -> None:
        """Drop one reference to each page; a page nobody references goes back to the free queue.
        Pages are released last-first so that a request's tail is evicted before its head.
        All or nothing: a double free anywhere in the list (a page listed more times than it has owners)
        raises before any page is released, so the books stay as they were."""
        refs = self.ref_counts
        if any(refs[page] <= 0 for page in pages) or (
                len(set(pages)) != len(pages) and any(refs[page] < n for page, n in Counter(pages).items())):
            page = next(p for p, n in Counter(pages).items() if refs[p] < n)
            raise RuntimeError(f"page {page} freed {pages.count(page)} time(s) but held by {refs[page]} owner(s) "
                               "(double free): nothing was freed")
        for page in reversed(pages):
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None
                if not self.is_cached(page):
                    self._free.move_to_end(page, last=False)

    def check_invariants(self) -> None:
        """used + free == total; a page is free iff nobody references it. For tests and debugging."""
        for page, rc in enumerate(self.ref_counts):
            if rc < 0:
                raise AssertionError(f"page {page} has negative refcount {rc}")
            if (rc == 0) != (page in self._free):
                raise AssertionError(f"page {page}: refcount {rc} but free={page in self._free}")
        assert self.num_used_pages + self.num_free_pages == self.num_pages
