"""Notebook 06 (prefix caching): chained page keys, and a prefix cache over the block pool."""

ROOT = 0  # the parent serial of a sequence's first page


def page_keys(token_ids, page_size):
    """One key per FULL page: key_i = hash((key_{i-1}, tuple(page_i))) with key_{-1} = 0, so a
    key names the whole prefix up to and including its page, not just the page's tokens."""
    keys, parent = [], 0
    for i in range(len(token_ids) // page_size):
        parent = hash((parent, tuple(token_ids[i * page_size:(i + 1) * page_size])))
        keys.append(parent)
    return keys


class StudentPrefixCache:
    """Full pages of computed tokens, found again by their chained key.

    Each registration gets a fresh `serial`; a page's key is hash((parent serial, tokens)), and
    each entry stores its parent serial and tokens, so every hit is confirmed: a hash collision
    costs a miss, never a wrong page. Cached pages whose last user left stay in the pool's free
    queue; the pool calls `evict(page)` just before it reuses one."""

    def __init__(self, pool):
        self.pool = pool
        self.key_to_page = {}
        self.entries = {}  # page -> (key, serial, parent_serial, tokens)
        self._next_serial = ROOT + 1
        self.queried_tokens = 0
        self.hit_tokens = 0
        pool.is_cached = self.is_cached
        pool.on_evict = self.evict

    @property
    def hit_rate(self):
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def is_cached(self, page):
        return page in self.entries

    def evict(self, page):
        key = self.entries.pop(page)[0]
        if self.key_to_page.get(key) == page:
            del self.key_to_page[key]

    def lookup(self, token_ids, max_pages):
        """The cached pages that start `token_ids` (at most max_pages, stopping at the first miss)
        and the serial of the last one (ROOT if none). Takes no references."""
        ps = self.pool.page_size
        pages, parent = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            page = self.key_to_page.get(hash((parent, tokens)))
            entry = self.entries.get(page) if page is not None else None
            if entry is None or entry[2] != parent or entry[3] != tokens:
                break  # a miss, or a collision caught by the confirmation
            pages.append(page)
            parent = entry[1]
        return pages, parent

    def register(self, page, parent_serial, tokens):
        """Offer a freshly filled page. Returns the serial the next page chains from: this page's,
        or that of an identical page already cached (then this copy stays private)."""
        tokens = tuple(tokens)
        key = hash((parent_serial, tokens))
        existing = self.key_to_page.get(key)
        if existing is not None:
            _, serial, parent, old_tokens = self.entries[existing]
            if parent == parent_serial and old_tokens == tokens:
                return serial
            return self._new_serial()  # a collision: keep this page private under a fresh identity
        serial = self._new_serial()
        self.key_to_page[key] = page
        self.entries[page] = (key, serial, parent_serial, tokens)
        return serial

    def _new_serial(self):
        self._next_serial += 1
        return self._next_serial - 1
