"""Notebook 06 prefix_caching: reference solutions. GENERATED from solutions/06_prefix_caching/06_prefix_caching.ipynb by
scripts/extract_references.py: do not edit; edit the notebook's solution cells."""





def page_keys(token_ids: list[int], page_size: int) -> list[int]:
    """Chained keys of the full pages: each names the whole prefix up to and including its page."""
    keys, previous = [], 0
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        previous = hash((previous, tuple(token_ids[start:start + page_size])))
        keys.append(previous)
    return keys


ROOT = 0
class StudentPrefixCache:
    """Full pages of computed K/V, found again through chained, confirmed keys."""

    def __init__(self, pool):
        self.pool = pool
        self.page_of_key = {}  # key -> page
        self.entry_of_page = {}  # page -> (key, serial, parent_serial, tokens)
        self.last_serial = ROOT
        self.queried_tokens = 0
        self.hit_tokens = 0
        pool.is_cached = self.is_cached
        pool.on_evict = self.evict

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def is_cached(self, page: int) -> bool:
        return page in self.entry_of_page

    def register(self, page: int, parent_serial: int, tokens) -> int:
        tokens = tuple(tokens)
        key = hash((parent_serial, tokens))
        self.last_serial += 1
        fresh = self.last_serial
        if key in self.page_of_key:
            _, serial, parent, stored = self.entry_of_page[self.page_of_key[key]]
            if parent == parent_serial and stored == tokens:
                return serial  # the same prefix is already cached: chain on it, keep this copy private
            return fresh  # a collision: this page stays private, under an identity of its own
        self.page_of_key[key] = page
        self.entry_of_page[page] = (key, fresh, parent_serial, tokens)
        return fresh

    def lookup(self, token_ids, max_pages: int):
        size = self.pool.page_size
        found, parent = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * size:(i + 1) * size])
            page = self.page_of_key.get(hash((parent, tokens)))
            if page is None:
                break
            _, serial, stored_parent, stored_tokens = self.entry_of_page[page]
            if stored_parent != parent or stored_tokens != tokens:
                break  # the key matched but the contents do not: a hash collision
            found.append(page)
            parent = serial
        return found, parent

    def evict(self, page: int) -> None:
        key = self.entry_of_page.pop(page)[0]
        if self.page_of_key.get(key) == page:
            del self.page_of_key[key]
