"""The KV manager: makes room for each scheduled token, or says no.

It keeps one page table per request on top of a shared `BlockPool` (bookkeeping only: the K/V
tensors belong to the model runner), answers the scheduler's questions (`can_allocate`),
performs its actions (`allocate`: room for more tokens of a request; `free`: all of a request's
pages back), offers full pages to the prefix cache (`commit`), and counts waste: slots reserved
for a request but not (yet) holding one of its tokens. It reads a request's progress counter
but never writes it: the scheduler does.

Parallel sampling (vLLM's copy on write): `fork(parent, child)` gives a new sample the pages of the
sample its prompt was computed for, by reference (the pool's `share`: one more owner each, no K/V
moves). A sample about to write into a page it still shares (its last, partly filled prompt page:
full pages are never written again) first takes a fresh page, records (shared page, fresh page) in
`pending_copies` for the runner to copy the K/V rows into before the forward pass, and drops its
reference to the shared page (`_copy_on_write`). Only the pool's allocate / free / share / ref_counts
are used, so a student's pool plugs in unchanged.

The contiguous baseline is the same code with one page of `max_model_len` slots per request
(`reserve_max_len=True`): the first token reserves room for the longest possible sequence,
which is exactly what a per-request contiguous buffer does.
"""
from __future__ import annotations

from .block_pool import BlockPool
from .page_table import PageTable
from .prefix_cache import ROOT, PrefixCache


class KVCacheManager:
    def __init__(self, pool: BlockPool, max_model_len: int, prefix_cache: PrefixCache | None = None,
                 reserve_max_len: bool = False):
        self.pool = pool
        self.page_size = pool.page_size
        self.max_model_len = max_model_len
        self.prefix_cache = prefix_cache
        self.reserve_max_len = reserve_max_len
        self.tables: dict[str, PageTable] = {}
        self.filled: dict[str, int] = {}  # slots holding (or about to hold) this request's tokens
        self._num_filled = 0  # running sums of the above and of pages held: waste accounting is O(1)
        self._num_held_pages = 0
        self._chain: dict[str, tuple[int, int]] = {}  # prefix cache: (pages registered, last serial)
        # Copy on write: (shared page, fresh page) pairs the runner copies before the next forward pass
        # (the scheduler moves them into SchedulerOutput.page_copies), and the running counts /metrics shows.
        self.pending_copies: list[tuple[int, int]] = []
        self.num_forked_pages = 0  # pages forked samples took by reference instead of computing their own
        self.num_copied_pages = 0  # of those, pages copied on write since
        # The empty tail of a partly filled page shared by k samples is counted k times in the per-request
        # sums above: the k - 1 extra counts, subtracted from the waste (a shared page is wasted once).
        self._shared_tail_waste = 0

    # -- questions --------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    @property
    def num_free_pages(self) -> int:
        return self.pool.num_free_pages

    def _target_slots(self, request, num_new_tokens: int, cached_pages=()) -> int:
        if self.reserve_max_len:
            return self.max_model_len
        if request.request_id not in self.tables:  # not admitted yet: it will start after its cache hits
            return len(cached_pages) * self.page_size + num_new_tokens
        return request.num_computed_tokens + num_new_tokens

    def pages_to_hold(self, num_tokens: int) -> int:
        """Pages a request holding `num_tokens` K/V slots occupies."""
        if self.reserve_max_len:
            return 1 if num_tokens > 0 else 0
        return -(-num_tokens // self.page_size)

    def num_pages_needed(self, request, num_new_tokens: int, cached_pages=()) -> int:
        """Pages to take from the free queue so that `num_new_tokens` more tokens fit. Cached
        pages that nobody uses right now sit in that queue too, so reusing them counts."""
        table = self.tables.get(request.request_id)
        held = len(table.pages) if table else len(cached_pages)
        target = self._target_slots(request, num_new_tokens, cached_pages)
        fresh = max(0, self.pages_to_hold(target) - held)
        revived = sum(1 for p in cached_pages if self.pool.ref_counts[p] == 0)
        copy = 1 if table is not None and self._shared_write_page(table, request.num_computed_tokens) >= 0 else 0
        return fresh + revived + copy

    def can_allocate(self, request, num_new_tokens: int, cached_pages=()) -> bool:
        return self.num_pages_needed(request, num_new_tokens, cached_pages) <= self.pool.num_free_pages

    def allocated_slots(self) -> int:
        """Slots in pages that some request holds; a page shared through the prefix cache counts once."""
        return (self.pool.num_pages - self.pool.num_free_pages) * self.page_size

    def wasted_slots(self) -> int:
        """Reserved but empty: the unfilled tail of each request's pages. Shared pages are always
        full, so summing per request never counts a shared page's slots twice."""
        return self._num_held_pages * self.page_size - self._num_filled - self._shared_tail_waste

    def pages_saved_by_sharing(self) -> int:
        """Pages the running requests would hold more without sharing: page references they hold minus
        pages in use (prefix-cache hits and parallel samples' shared prompt pages)."""
        return self._num_held_pages - (self.pool.num_pages - self.pool.num_free_pages)

    def used_slots(self) -> int:
        return self.allocated_slots() - self.wasted_slots()

    def slots(self, request_id: str, start: int, count: int) -> list[int]:
        return self.tables[request_id].slots(start, count)

    def page_ids(self, request_id: str) -> list[int]:
        """The pages of `request_id`, in order (a copy)."""
        return list(self.tables[request_id].pages)

    block_table = page_ids  # vLLM's name for a request's pages, which notebook 6 calls

    # -- prefix cache ------------------------------------------------------------------------
    def lookup_prefix(self, request) -> list[int]:
        """Cached pages this (not yet admitted) request can start from. At least one token is
        always left to compute, so a fully cached prompt still produces its first token."""
        if self.prefix_cache is None or self.reserve_max_len:
            return []
        max_pages = (request.num_tokens - 1) // self.page_size
        pages, _ = self.prefix_cache.lookup(request.all_token_ids, max_pages)
        return pages

    # -- actions ----------------------------------------------------------------------------
    def try_append_slot(self, request) -> tuple[int, ...] | None:
        """The common decode: if the next token's slot is already inside the request's last page,
        claim it and return the request's pages (no page needed, no questions). None means: use
        can_allocate / allocate."""
        rid = request.request_id
        table = self.tables.get(rid)
        computed = request.num_computed_tokens
        if table is None or computed >= len(table.pages) * self.page_size:
            return None
        if self.pool.ref_counts[table.pages[-1]] > 1:
            return None  # its last page is shared with a sibling sample: allocate copies it first
        self._num_filled += computed + 1 - self.filled[rid]
        self.filled[rid] = computed + 1
        return table.pages

    def allocate(self, request, num_new_tokens: int, cached_pages=()) -> int:
        """Room for `num_new_tokens` more tokens of `request` (raises OutOfPages if there is none).
        On a request's first allocation, `cached_pages` (from lookup_prefix) become its first pages.
        Returns how many tokens those cached pages hold (0 after the first allocation): the
        scheduler moves the request's progress past them, this manager never does."""
        rid = request.request_id
        table = self.tables.get(rid)
        cached_tokens = 0
        if table is None:
            table = self.tables[rid] = PageTable(self.page_size)
            cached_tokens = len(cached_pages) * self.page_size
            if cached_pages:
                for page in cached_pages:
                    self.pool.share(page)
                table.pages = tuple(cached_pages)
                self._num_held_pages += len(cached_pages)
                _, serial = self.prefix_cache.lookup(request.all_token_ids, len(cached_pages))
                self._chain[rid] = (len(cached_pages), serial)
            if self.prefix_cache is not None:
                self.prefix_cache.queried_tokens += request.num_prompt_tokens
                self.prefix_cache.hit_tokens += min(cached_tokens, request.num_prompt_tokens)
            filled = cached_tokens + num_new_tokens
        else:
            computed = request.num_computed_tokens
            shared = self._shared_write_page(table, computed)
            if shared >= 0:
                self._copy_on_write(rid, table, shared)
            filled = computed + num_new_tokens
        target = self.max_model_len if self.reserve_max_len else filled
        need = self.pages_to_hold(target) - len(table.pages)
        if need > 0:
            table.pages += tuple(self.pool.allocate(need))
            self._num_held_pages += need
        self._num_filled += filled - self.filled.get(rid, 0)
        self.filled[rid] = filled
        return cached_tokens

    def truncate(self, request, num_tokens: int) -> None:
        """Keep room for the first `num_tokens` tokens of `request` only, giving back the pages past them
        (speculative decoding: a step wrote rejected drafts there; they were fresh pages, never shared
        nor committed to the prefix cache)."""
        rid = request.request_id
        table = self.tables[rid]
        self._num_filled += num_tokens - self.filled[rid]
        self.filled[rid] = num_tokens
        keep = self.pages_to_hold(num_tokens)
        extra = table.pages[keep:]
        if extra:
            table.pages = table.pages[:keep]
            self._num_held_pages -= len(extra)
            self.pool.free(extra)

    # -- parallel sampling: fork and copy on write ---------------------------------------------
    def fork(self, parent, child) -> None:
        """`child` (a new sample) starts as `parent` is now: the same pages, shared by reference."""
        pid, cid = parent.request_id, child.request_id
        pages = self.tables[pid].pages
        for page in pages:
            self.pool.share(page)
        table = self.tables[cid] = PageTable(self.page_size)
        table.pages = pages
        filled = self.filled[pid]
        self.filled[cid] = filled
        self._num_filled += filled
        self._num_held_pages += len(pages)
        self._shared_tail_waste += len(pages) * self.page_size - filled  # the shared last page's empty tail
        self.num_forked_pages += len(pages)
        if pid in self._chain:
            self._chain[cid] = self._chain[pid]

    def _shared_write_page(self, table: PageTable, position: int) -> int:
        """The index of the page that `position` is written into, if the request shares it; else -1."""
        i = position // self.page_size
        if i < len(table.pages) and self.pool.ref_counts[table.pages[i]] > 1:
            return i
        return -1

    def _copy_on_write(self, rid: str, table: PageTable, i: int) -> None:
        """Give `rid` a page of its own in place of its shared page `i` (its last, partly filled one)."""
        shared = table.pages[i]
        (fresh,) = self.pool.allocate(1)
        self.pending_copies.append((shared, fresh))
        self.num_copied_pages += 1
        self._shared_tail_waste -= self._tail_waste(rid, table)
        table.pages = table.pages[:i] + (fresh,) + table.pages[i + 1:]
        self.pool.free([shared])

    def _tail_waste(self, rid: str, table: PageTable) -> int:
        """Empty slots of `rid`'s last page (0 when it is full)."""
        return len(table.pages) * self.page_size - self.filled.get(rid, 0)

    def commit(self, request) -> None:
        """After a step: offer the request's newly completed pages to the prefix cache (the
        pages its progress counter has moved past)."""
        if self.prefix_cache is None or self.reserve_max_len:
            return
        rid = request.request_id
        done, serial = self._chain.get(rid, (0, ROOT))
        full = request.num_computed_tokens // self.page_size
        if full <= done:
            return
        pages, ps, tokens = self.tables[rid].pages, self.page_size, request.all_token_ids
        for i in range(done, full):
            serial = self.prefix_cache.register(pages[i], serial, tuple(tokens[i * ps : (i + 1) * ps]))
        self._chain[rid] = (full, serial)

    def free(self, request) -> None:
        """Give back every page of `request` (finished, aborted or preempted)."""
        rid = request.request_id
        table = self.tables.pop(rid, None)
        filled = self.filled.pop(rid, 0)
        self._num_filled -= filled
        self._chain.pop(rid, None)
        if table is not None:
            if table.pages and self.pool.ref_counts[table.pages[-1]] > 1:  # a sibling keeps the shared tail
                self._shared_tail_waste -= len(table.pages) * self.page_size - filled
            self._num_held_pages -= len(table.pages)
            self.pool.free(table.pages)
