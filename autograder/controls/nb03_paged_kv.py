"""Correct answers for notebook 03 written differently from the reference: each must pass every graded
seed (a check that fails them is a false alarm). Self-contained: no autograder imports."""
import heapq
import math

from course_lib.kv.block_pool import OutOfPages


class HeapPool:
    """Hands out the lowest free page id (a heap with lazy deletion), counts owners in a list, and
    keeps the free set as the truth; a double free raises ValueError."""

    def __init__(self, num_pages, page_size):
        self.num_pages, self.page_size = num_pages, page_size
        self.ref_counts = [0] * num_pages
        self._heap = list(range(num_pages))
        self._free = set(self._heap)
        self.on_evict = None
        self.is_cached = lambda page: False

    @property
    def num_free_pages(self):
        return len(self._free)

    def is_free(self, page):
        return page in self._free

    def allocate(self, n):
        if len(self._free) < n:
            raise OutOfPages(f"{n} pages wanted, {len(self._free)} free")
        taken = []
        while len(taken) < n:
            page = heapq.heappop(self._heap)
            if page not in self._free:
                continue  # stale heap entry (revived by share)
            self._free.remove(page)
            if self.on_evict is not None and self.is_cached(page):
                self.on_evict(page)
            self.ref_counts[page] += 1
            taken.append(page)
        return taken

    def free(self, pages):
        for page in pages:
            if page in self._free or self.ref_counts[page] == 0:
                raise ValueError(f"double free of page {page}")
            self.ref_counts[page] -= 1
            if not self.ref_counts[page]:
                self._free.add(page)
                heapq.heappush(self._heap, page)

    def share(self, page):
        self._free.discard(page)
        self.ref_counts[page] += 1


def slot_mapping_with_divmod(block_table, page_size, start, count):
    """divmod per position, as a list comprehension over the positions."""
    out = []
    for position in range(start, start + count):
        entry, row = divmod(position, page_size)
        out.append(block_table[entry] * page_size + row)
    return out


def paged_waste_with_ceil(num_tokens_per_request, page_size):
    """math.ceil on a float division, slots reserved minus slots filled."""
    reserved = sum(math.ceil(n / page_size) * page_size for n in num_tokens_per_request)
    return int(reserved - sum(num_tokens_per_request))


def contiguous_waste_in_one_line(num_tokens_per_request, max_len):
    """All reservations minus all tokens."""
    return len(num_tokens_per_request) * max_len - sum(num_tokens_per_request)


CONTROLS = {
    "StudentBlockPool": [HeapPool],
    "slot_mapping": [slot_mapping_with_divmod],
    "paged_waste": [paged_waste_with_ceil],
    "contiguous_waste": [contiguous_waste_in_one_line],
}
