"""Prefix caching: full pages of prompt tokens are computed once and shared.

Each full page gets a key hashed over (its parent page's identity, its tokens), so a key
names a whole prefix, not just one page. A lookup walks a new prompt page by page and stops
at the first miss. Every hit is *confirmed* against the stored tokens and the stored parent,
so a hash collision can cost a cache miss but never a wrong answer.

Cached pages whose last user has gone keep their contents and key in the pool's free queue
(least recently freed at the front); they are evicted only when the pool reuses them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .block_pool import BlockPool

ROOT = 0  # the "parent serial" of a request's first page


@dataclass
class CachedPage:
    key: int
    serial: int  # unique per registration: children confirm their parent by it
    parent_serial: int
    tokens: tuple


class PrefixCache:
    def __init__(self, pool: BlockPool, hash_fn=hash):
        self.pool = pool
        self.hash_fn = hash_fn
        self.key_to_page: dict[int, int] = {}
        self.pages: dict[int, CachedPage] = {}
        self._next_serial = ROOT + 1
        self.queried_tokens = 0
        self.hit_tokens = 0
        pool.is_cached = self.is_cached
        pool.on_evict = self.evict

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def is_cached(self, page: int) -> bool:
        return page in self.pages

    def evict(self, page: int) -> None:
        entry = self.pages.pop(page)
        if self.key_to_page.get(entry.key) == page:
            del self.key_to_page[entry.key]

    def _key(self, parent_serial: int, tokens: tuple) -> int:
        return self.hash_fn((parent_serial, tokens))

    def lookup(self, token_ids: list[int], max_pages: int) -> tuple[list[int], int]:
        """The longest chain of cached pages that starts `token_ids` (at most `max_pages`), and
        the serial of its last page. Takes no references: the caller shares the pages it keeps."""
        ps = self.pool.page_size
        hits, parent = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * ps : (i + 1) * ps])
            page = self.key_to_page.get(self._key(parent, tokens))
            entry = self.pages.get(page) if page is not None else None
            if entry is None or entry.parent_serial != parent or entry.tokens != tokens:
                break  # a miss, or a hash collision caught by the confirmation
            hits.append(page)
            parent = entry.serial
        return hits, parent

    def register(self, page: int, parent_serial: int, tokens: tuple) -> int:
        """Offer a freshly filled page to the cache. Returns the serial later pages chain from:
        this page's, or that of an identical page already cached (then this one stays private)."""
        key = self._key(parent_serial, tokens)
        existing = self.key_to_page.get(key)
        if existing is not None:
            entry = self.pages[existing]
            if entry.parent_serial == parent_serial and entry.tokens == tokens:
                return entry.serial
            return self._new_serial()  # collision: keep ours private, chain on a fresh identity
        serial = self._new_serial()
        self.key_to_page[key] = page
        self.pages[page] = CachedPage(key, serial, parent_serial, tokens)
        return serial

    def _new_serial(self) -> int:
        self._next_serial += 1
        return self._next_serial - 1
