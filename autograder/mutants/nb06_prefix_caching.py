"""Realistic wrong answers for notebook 06 (prefix caching). Self-contained: no autograder imports."""
import hashlib

ROOT = 0


def keys_not_chained(token_ids, page_size):
    """Hashes each page on its own: equal pages after different prefixes get equal keys."""
    return [hash(tuple(token_ids[i * page_size:(i + 1) * page_size])) for i in range(len(token_ids) // page_size)]


def keys_include_partial_page(token_ids, page_size):
    """Also keys the last, partly filled page."""
    keys, parent = [], 0
    for i in range(-(-len(token_ids) // page_size)):
        parent = hash((parent, tuple(token_ids[i * page_size:(i + 1) * page_size])))
        keys.append(parent)
    return keys


def keys_drop_last_full_page(token_ids, page_size):
    """Off by one: the last full page gets no key."""
    keys, parent = [], 0
    for i in range(max(0, len(token_ids) // page_size - 1)):
        parent = hash((parent, tuple(token_ids[i * page_size:(i + 1) * page_size])))
        keys.append(parent)
    return keys


def keys_chained_on_position(token_ids, page_size):
    """Mixes in the page's index instead of the previous key."""
    return [hash((i, tuple(token_ids[i * page_size:(i + 1) * page_size]))) for i in range(len(token_ids) // page_size)]


def keys_xor_of_pages(token_ids, page_size):
    """Combines the page hashes with XOR: order-blind (P Q and Q P collide) and P P cancels out."""
    keys, acc = [], 0
    for i in range(len(token_ids) // page_size):
        acc ^= hash(tuple(token_ids[i * page_size:(i + 1) * page_size]))
        keys.append(acc)
    return keys


def keys_sum_of_page(token_ids, page_size):
    """Chains on the sum of the page's tokens: (1, 4) and (2, 3) look the same."""
    keys, parent = [], 0
    for i in range(len(token_ids) // page_size):
        parent = hash((parent, sum(token_ids[i * page_size:(i + 1) * page_size])))
        keys.append(parent)
    return keys


def keys_sorted_page(token_ids, page_size):
    """Sorts each page's tokens (as if a page were a set): a page and its reverse collide."""
    keys, parent = [], 0
    for i in range(len(token_ids) // page_size):
        parent = hash((parent, tuple(sorted(token_ids[i * page_size:(i + 1) * page_size]))))
        keys.append(parent)
    return keys


def keys_salted_with_length(token_ids, page_size):
    """Mixes the prompt's length into every key: the same prefix in a longer prompt gets other keys."""
    keys, parent = [], len(token_ids)
    for i in range(len(token_ids) // page_size):
        parent = hash((parent, tuple(token_ids[i * page_size:(i + 1) * page_size])))
        keys.append(parent)
    return keys


def keys_rehash_whole_prefix(token_ids, page_size):
    """Hashes the whole prefix again for every page: right keys, quadratic work in the prompt's length."""
    return [hash(tuple(token_ids[:(i + 1) * page_size])) for i in range(len(token_ids) // page_size)]


def keys_copy_then_rehash_prefix(token_ids, page_size):
    """Copies its input once (one read per token), then hashes the copy's whole prefix again for every page:
    right keys, quadratic work that counting the reads of the input cannot see."""
    tokens = list(token_ids)
    return [hash(tuple(tokens[:(i + 1) * page_size])) for i in range(len(tokens) // page_size)]


def keys_digest_of_prefix_text(token_ids, page_size):
    """A sha256 of the prefix written out as text, for every page, from a copy of the input: right keys (64 bits
    of the digest), quadratic work."""
    tokens = list(token_ids)
    keys = []
    for i in range(len(tokens) // page_size):
        text = ",".join(map(str, tokens[:(i + 1) * page_size]))
        keys.append(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))
    return keys


def keys_whole_prefix(token_ids, page_size):
    """The key IS the prefix (a tuple of every token up to the page's end): right keys, but each one as large
    as its prefix, so building, storing and hashing them is quadratic."""
    return [tuple(token_ids[:(i + 1) * page_size]) for i in range(len(token_ids) // page_size)]


def keys_nested_chain(token_ids, page_size):
    """Chains the previous KEY itself, not its hash: reads each token once, but key i nests every earlier key
    (hashing it walks the whole prefix)."""
    keys, previous = [], None
    for i in range(len(token_ids) // page_size):
        previous = (previous, tuple(token_ids[i * page_size:(i + 1) * page_size]))
        keys.append(previous)
    return keys


class _Cache:
    """A correct prefix cache; each mutant below breaks one rule of it."""

    def __init__(self, pool):
        self.pool = pool
        self.key_to_page = {}
        self.entries = {}  # page -> (key, serial, parent, tokens)
        self._next = ROOT + 1
        self.queried_tokens = 0
        self.hit_tokens = 0
        self._install(pool)

    def _install(self, pool):
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

    def _confirm(self, entry, parent, tokens):
        return entry[2] == parent and entry[3] == tokens

    def _stop_on_miss(self):
        return True

    def _limit(self, max_pages, token_ids):
        return max_pages

    def lookup(self, token_ids, max_pages):
        ps = self.pool.page_size
        pages, parent = [], ROOT
        for i in range(self._limit(max_pages, token_ids)):
            tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            page = self.key_to_page.get(hash((parent, tokens)))
            entry = self.entries.get(page) if page is not None else None
            if entry is None or not self._confirm(entry, parent, tokens):
                if self._stop_on_miss():
                    break
                continue
            pages.append(page)
            parent = entry[1]
        return pages, self._result_serial(parent, pages)

    def _result_serial(self, parent, pages):
        return parent

    def register(self, page, parent_serial, tokens):
        tokens = tuple(tokens)
        key = hash((parent_serial, tokens))
        existing = self.key_to_page.get(key)
        if existing is not None:
            _, serial, parent, old = self.entries[existing]
            if parent == parent_serial and old == tokens:
                return serial
            return self._new()
        serial = self._new()
        self.key_to_page[key] = page
        self.entries[page] = (key, serial, parent_serial, tokens)
        return serial

    def _new(self):
        self._next += 1
        return self._next - 1


class TrustsTheHash(_Cache):
    """Never confirms a hit: a hash collision returns another prompt's page."""

    def _confirm(self, entry, parent, tokens):
        return True


class ConfirmsTokensOnly(_Cache):
    """Confirms the tokens but not the parent: same tokens after a different prefix count as a hit."""

    def _confirm(self, entry, parent, tokens):
        return entry[3] == tokens


class EvictDoesNothing(_Cache):
    """evict() forgets nothing: a reused page stays 'cached' with its old key and tokens."""

    def evict(self, page):
        pass


class HooksNotInstalled(_Cache):
    """Never installs is_cached / on_evict on the pool, so it is never told about evictions."""

    def _install(self, pool):
        pass


class LookupSkipsMisses(_Cache):
    """Keeps walking after a miss, so later pages of a different prefix can 'hit'."""

    def _stop_on_miss(self):
        return False


class LookupIgnoresMaxPages(_Cache):
    """Walks every full page of the prompt, ignoring max_pages."""

    def _limit(self, max_pages, token_ids):
        return len(token_ids) // self.pool.page_size


class LookupReturnsRootSerial(_Cache):
    """Returns ROOT as the serial even after hits: the request's next pages chain from the wrong parent."""

    def _result_serial(self, parent, pages):
        return ROOT


class HitRateIntegerDivision(_Cache):
    """hit_rate with integer division: always 0 (or 1)."""

    @property
    def hit_rate(self):
        return self.hit_tokens // self.queried_tokens if self.queried_tokens else 0


class KeyedOnPosition(_Cache):
    """Keys a page by (its index, its tokens) and confirms the tokens: a page after another prefix hits."""

    def __init__(self, pool):
        super().__init__(pool)
        self.index_of = {}  # serial -> index of its page in the prompt

    def lookup(self, token_ids, max_pages):
        ps = self.pool.page_size
        pages, serial = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            page = self.key_to_page.get((i, tokens))
            if page is None or page not in self.entries:
                break
            pages.append(page)
            serial = self.entries[page][1]
        return pages, serial

    def register(self, page, parent_serial, tokens):
        tokens = tuple(tokens)
        index = 0 if parent_serial == ROOT else self.index_of.get(parent_serial, -1) + 1
        key = (index, tokens)
        existing = self.key_to_page.get(key)
        if existing is not None and existing in self.entries:
            return self.entries[existing][1]
        serial = self._new()
        self.key_to_page[key] = page
        self.entries[page] = (key, serial, parent_serial, tokens)
        self.index_of[serial] = index
        return serial


class EvictKeepsKey(_Cache):
    """evict() forgets the page but leaves its key: the evicted prefix, computed again, is taken for a
    duplicate of the page that is gone, so it is never cached again."""

    def evict(self, page):
        key, serial, _, _ = self.entries.pop(page)
        self.gone = getattr(self, "gone", {})
        self.gone[key] = serial

    def register(self, page, parent_serial, tokens):
        key = hash((parent_serial, tuple(tokens)))
        if key in getattr(self, "gone", {}) and self.key_to_page.get(key) not in self.entries:
            return self.gone[key]
        return super().register(page, parent_serial, tokens)


class DuplicateTakesOver(_Cache):
    """A duplicate registration replaces the cached copy: the key moves to the new page, with a new serial."""

    def register(self, page, parent_serial, tokens):
        tokens = tuple(tokens)
        key = hash((parent_serial, tokens))
        old = self.key_to_page.get(key)
        if old is not None and self.entries[old][2:] == (parent_serial, tokens):
            del self.entries[old]
            del self.key_to_page[key]
        return super().register(page, parent_serial, tokens)


class ConfirmsTokensPresent(_Cache):
    """Confirms only the tokens the prompt has: a partly filled last page matches a full cached page."""

    def lookup(self, token_ids, max_pages):
        ps = self.pool.page_size
        pages, parent = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            match = None
            for page, (_, serial, stored_parent, stored) in self.entries.items():
                if stored_parent == parent and stored[:len(tokens)] == tokens and tokens:
                    match = (page, serial)
                    break
            if match is None:
                break
            pages.append(match[0])
            parent = match[1]
        return pages, parent


class LookupCountsToo(_Cache):
    """Adds to queried_tokens / hit_tokens in lookup, which the engine already counts (and asks again
    every step while a request waits)."""

    def lookup(self, token_ids, max_pages):
        pages, serial = super().lookup(token_ids, max_pages)
        self.queried_tokens += len(token_ids)
        self.hit_tokens += len(pages) * self.pool.page_size
        return pages, serial



class RegisterTrustsTheHash(_Cache):
    """Confirms its lookups, but register takes any key match for a duplicate: a page whose hash merely
    collides with a cached one gets that page's serial, so its successors chain onto the wrong prefix."""

    def register(self, page, parent_serial, tokens):
        existing = self.key_to_page.get(hash((parent_serial, tuple(tokens))))
        if existing is not None:
            return self.entries[existing][1]
        return super().register(page, parent_serial, tokens)

class LookupSharesPages(_Cache):
    """Takes a reference on every page it finds (pool.share), as if the lookup were the admission: the KV
    manager shares the pages it keeps too, so each hit is counted twice and its page never comes free."""

    def lookup(self, token_ids, max_pages):
        pages, serial = super().lookup(token_ids, max_pages)
        for page in pages:
            self.pool.share(page)
        return pages, serial


class SerialIsPage(_Cache):
    """Uses the page number (+ 1, to avoid ROOT) as the serial: after a page is evicted and reused for another
    prefix, the old page's children hang under the new page's serial and are found after the wrong parent."""

    def register(self, page, parent_serial, tokens):
        tokens = tuple(tokens)
        key = hash((parent_serial, tokens))
        existing = self.key_to_page.get(key)
        if existing is not None:
            _, serial, parent, old = self.entries[existing]
            if parent == parent_serial and old == tokens:
                return serial
            return page + 1
        self.key_to_page[key] = page
        self.entries[page] = (key, page + 1, parent_serial, tokens)
        return page + 1


class StaleChildByPage(_Cache):
    """A tree of children keyed by (parent serial, tokens) -> page; evict only marks the page uncached, and a
    lookup trusts a child whose page number is cached again, even though that page now holds another prefix."""

    def __init__(self, pool):
        super().__init__(pool)
        self.children = {}  # (parent serial, tokens) -> (page, serial)
        self.cached = {}  # page -> serial

    def is_cached(self, page):
        return page in self.cached

    def evict(self, page):
        del self.cached[page]

    def register(self, page, parent_serial, tokens):
        child = self.children.get((parent_serial, tuple(tokens)))
        if child is not None and child[0] in self.cached:
            return child[1]
        serial = self._new()
        self.children[(parent_serial, tuple(tokens))] = (page, serial)
        self.cached[page] = serial
        return serial

    def lookup(self, token_ids, max_pages):
        ps = self.pool.page_size
        pages, parent = [], ROOT
        for i in range(max_pages):
            tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            child = self.children.get((parent, tokens)) if len(tokens) == ps else None
            if child is None or child[0] not in self.cached:
                break
            pages.append(child[0])
            parent = child[1]
        return pages, parent


MUTANTS = {
    "page_keys": [keys_not_chained, keys_rehash_whole_prefix, keys_copy_then_rehash_prefix, keys_digest_of_prefix_text,
                  keys_whole_prefix, keys_nested_chain,
                  keys_include_partial_page, keys_drop_last_full_page, keys_chained_on_position,
                  keys_xor_of_pages, keys_sum_of_page, keys_sorted_page, keys_salted_with_length],
    "StudentPrefixCache": [TrustsTheHash, ConfirmsTokensOnly, EvictDoesNothing, HooksNotInstalled, LookupSkipsMisses,
                           LookupIgnoresMaxPages, LookupReturnsRootSerial, HitRateIntegerDivision, KeyedOnPosition,
                           EvictKeepsKey, DuplicateTakesOver, ConfirmsTokensPresent, LookupCountsToo,
                           RegisterTrustsTheHash, LookupSharesPages, SerialIsPage, StaleChildByPage],
}
