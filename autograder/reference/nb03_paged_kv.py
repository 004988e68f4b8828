"""Notebook 03 paged_kv: reference solutions. GENERATED from solutions/03_paged_kv/03_paged_kv.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""


from collections import Counter, deque
import torch
from course_lib.kv.block_pool import BlockPool, OutOfPages
from course_lib.runner_batch import FlatBatch
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput


class StudentBlockPool:
    """The books of the KV pool: which pages are free, and how many owners each used page has."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        self.ref_counts = [0] * num_pages
        self._free = deque(range(num_pages))  # free pages; allocate takes from the left
        self._free_set = set(range(num_pages))  # the same pages, for O(1) membership
        self.on_evict = None
        self.is_cached = lambda page: False

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def is_free(self, page: int) -> bool:
        return page in self._free_set

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages but only {len(self._free)} of {self.num_pages} are free")
        pages = []
        for _ in range(n):
            page = self._free.popleft()
            self._free_set.discard(page)
            if self.on_evict is not None and self.is_cached(page):
                self.on_evict(page)  # its cached contents are about to be overwritten
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def free(self, pages: list[int]) -> None:
        for page, times in Counter(pages).items():  # all or nothing: check every page before changing any
            if self.ref_counts[page] < times:
                raise RuntimeError(f"double free: page {page} is freed {times} time(s) but has "
                                   f"{self.ref_counts[page]} owner(s)")
        for page in pages:
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free.append(page)
                self._free_set.add(page)

    def share(self, page: int) -> None:
        if self.ref_counts[page] == 0:  # a free page with valid (cached) contents comes back into use
            self._free.remove(page)
            self._free_set.discard(page)
        self.ref_counts[page] += 1


def slot_mapping(block_table: list[int], page_size: int, start: int, count: int) -> list[int]:
    """Physical slot of each token position start .. start + count - 1."""
    slots = []
    for position in range(start, start + count):
        page = block_table[position // page_size]
        slots.append(page * page_size + position % page_size)
    return slots


def build_flat_batch(output: SchedulerOutput, page_size: int, device="cpu", pad_slot: int = 0) -> FlatBatch:
    """One step's SchedulerOutput as the flat batch the paged forward pass reads."""
    pad = output.num_padded_tokens
    token_ids, positions, slots = [0] * pad, [0] * pad, [pad_slot] * pad
    tables = [[pad_slot // page_size] for _ in range(pad)]  # a padding row reads only its own slot
    seq_lens = [1] * pad
    query_start_loc = list(range(pad + 1))
    for s in output.scheduled:
        end = s.start + s.num_new_tokens
        token_ids += s.token_ids
        positions += range(s.start, end)
        slots += slot_mapping(s.page_ids, page_size, s.start, s.num_new_tokens)
        tables.append(list(s.page_ids))
        seq_lens.append(end)
        query_start_loc.append(query_start_loc[-1] + s.num_new_tokens)
    width = max(len(table) for table in tables)
    block_tables = [table + [0] * (width - len(table)) for table in tables]

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    return FlatBatch(token_ids=tensor(token_ids, torch.long), positions=tensor(positions, torch.long),
                     slot_mapping=tensor(slots, torch.long), block_tables=tensor(block_tables, torch.int32),
                     seq_lens=tensor(seq_lens, torch.int32), query_start_loc=tensor(query_start_loc, torch.int32))


def paged_waste(num_tokens_per_request: list[int], page_size: int) -> int:
    """Reserved-but-unused slots when every request holds ceil(n / page_size) pages."""
    return sum(-(-n // page_size) * page_size - n for n in num_tokens_per_request)
def contiguous_waste(num_tokens_per_request: list[int], max_len: int) -> int:
    """Reserved-but-unused slots when every request reserves max_len slots."""
    return sum(max_len - n for n in num_tokens_per_request)
