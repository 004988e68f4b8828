"""Notebook 03 (paged KV): the block pool, slot numbers, and how much memory each layout wastes."""
from course_lib.kv.block_pool import OutOfPages


class StudentBlockPool:
    """Bookkeeping for a pool of `num_pages` pages of `page_size` slots: which pages are free,
    and how many owners each used page has (a page shared through the prefix cache has several)."""

    def __init__(self, num_pages, page_size):
        self.num_pages = num_pages
        self.page_size = page_size
        self.ref_counts = [0] * num_pages
        self._free = dict.fromkeys(range(num_pages))  # an ordered set: allocation takes the front
        # Hooks the prefix cache installs: is a page's content cached, and what to do when such a
        # page is about to be overwritten.
        self.on_evict = None
        self.is_cached = lambda page: False

    @property
    def num_free_pages(self):
        return len(self._free)

    def is_free(self, page):
        return page in self._free

    def allocate(self, n):
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages but only {len(self._free)} of {self.num_pages} are free")
        pages = []
        for _ in range(n):
            page = next(iter(self._free))
            del self._free[page]
            if self.on_evict is not None and self.is_cached(page):
                self.on_evict(page)
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def share(self, page):
        if self.ref_counts[page] == 0:
            del self._free[page]  # a free page with cached content comes back into use
        self.ref_counts[page] += 1

    def free(self, pages):
        for page in reversed(pages):
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"page {page} freed more times than it was allocated (double free)")
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None


def slot_mapping(block_table, page_size, start, count):
    """Physical slot (page * page_size + offset) of each token position start .. start+count-1."""
    return [block_table[pos // page_size] * page_size + pos % page_size for pos in range(start, start + count)]


def paged_waste(num_tokens_per_request, page_size):
    """Slots reserved but unused when each request holds just enough whole pages."""
    return sum(-(-n // page_size) * page_size - n for n in num_tokens_per_request)


def contiguous_waste(num_tokens_per_request, max_len):
    """Slots reserved but unused when each request reserves max_len slots up front."""
    return sum(max_len - n for n in num_tokens_per_request)
