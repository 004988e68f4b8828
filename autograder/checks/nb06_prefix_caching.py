"""Checks for notebook 06 (prefix caching): keys that name whole prefixes, and the prefix cache.

`page_keys` is held to what a key is *for*, not to one formula: one key per full page (a partly
filled page gets none), each key a function of the whole prefix up to its page (equal prefixes,
equal keys; a different token anywhere before or in the page, a different key), checked at every
position of a chain, with repeated, swapped and equal-sum pages, across every call of the check; and to
linear work: the tokens read from a counting sequence, each key's size, and the data the student's code
hashes (through `hash`, `hashlib`, `zlib`) on 4x the pages.

The cache is checked on its own (lookup, the stop at the first miss, max_pages, the partial last
page, duplicates, eviction through the pool's hooks, re-registering an evicted prefix, exact
counters), under forced hash collisions at every position of a chain (the builtin `hash` is
swapped, while the cache runs, for one that makes the probe's page collide with the registered
one: on its tokens, or on its parent; looked up and registered, in both orders), and inside the
real engine: a float64 model serves prompts
that share prefixes from a pool small enough that cached pages are evicted and registered again;
greedy tokens must not change, and the counters must equal those of course_lib's cache serving
the same requests.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import random
import sys
import zlib

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool

from .. import _checking, fixtures
from .._checking import (broke, call, check, drive, expect, fail, forbid_calls, kind_of, naming_rule, plain_int,
                         same_float, show)

ROOT = 0


def _prefix_cache_class():
    from course_lib.kv.prefix_cache import PrefixCache

    return (PrefixCache,)


def _prefix_cache_module():
    import course_lib.kv.prefix_cache as prefix_cache

    return [prefix_cache]


# ---------------------------------------------------------------------------------------------
# page_keys
# ---------------------------------------------------------------------------------------------


class _KeyBook:
    """Every (page size, prefix) -> key the student's page_keys produced during one check: a key
    must be a function of its prefix alone, and two different prefixes must never share a key."""

    def __init__(self, impl):
        self.impl = impl
        self.by_prefix: dict[tuple, object] = {}
        self.by_key: dict[tuple, tuple] = {}

    def keys(self, tokens, ps):
        shown = f"page_keys({_short(tokens)}, page_size={ps})"
        got = call(shown, self.impl, list(tokens), ps)
        expect(type(got) in (list, tuple), lambda: f"{shown} must return a list of keys, got {kind_of(got)}",
               rule="one key per full page")
        got = list(got)
        bad = next((i for i, key in enumerate(got) if not _plain_key(key)), None)
        expect(bad is None, lambda: f"{shown}: key {bad} is {kind_of(got[bad])} {show(got[bad])}: a key must be plain "
                                    "data (an int, a str, bytes, or a tuple of those), compared by its value",
               rule="plain keys")
        full = len(tokens) // ps
        if len(got) != full:
            extra = (f" the last {len(tokens) % ps} token(s) do not fill a page, so they get no key (a partly "
                     "filled page is still growing: its contents will change)" if len(got) == full + 1 and
                     len(tokens) % ps else "")
            broke("one key per full page", f"{shown} returned {len(got)} keys, expected one per FULL page: "
                  f"{len(tokens)} // {ps} = {full}.{extra}")
        for i, key in enumerate(got):
            try:
                hash(key)
            except TypeError:
                broke("plain keys", f"{shown}: key {i} is a {type(key).__name__}, which cannot be a dict key (use an "
                      "int or a tuple)")
            prefix = tuple(tokens[:(i + 1) * ps])
            before = self.by_prefix.get((ps, prefix))
            if before is not None and before != key:
                broke("a function of the prefix",
                      f"page_keys is not a function of the prefix: the prefix {_short(prefix)} (page {i}, page_size "
                      f"{ps}) got key {before!r} in an earlier call and {key!r} now. A key may depend only on the "
                      "tokens up to and including its page (no randomness, no counter, nothing about later pages)")
            other = self.by_key.get((ps, key))
            if other is not None and other != prefix:
                broke("different prefixes, different keys",
                      f"page_keys gave the same key {key!r} to two different prefixes (page_size {ps}):\n"
                      f"  {_short(other)}\n  {_short(prefix)}\n{_why_same(other, prefix, ps)}")
            self.by_prefix[(ps, prefix)] = key
            self.by_key[(ps, key)] = prefix
        return got


def _plain_key(key, depth=0) -> bool:
    """A key of plain data (an int, a str, bytes, a tuple of them): its equality and hash are its value's, so
    comparing two keys asks the student's code nothing."""
    import numpy as np

    t = type(key)
    if t in (int, str, bytes, float, bool, type(None)) or t in (np.int64, np.uint64, np.int32, np.uint32):
        return True
    return t in (tuple, frozenset) and depth < 20 and all(_plain_key(k, depth + 1) for k in key)


def _short(tokens, limit=24):
    tokens = list(tokens)
    return str(tokens) if len(tokens) <= limit else f"[{', '.join(map(str, tokens[:limit]))}, ... ({len(tokens)} tokens)]"


def _why_same(a, b, ps):
    """Name the rule two colliding prefixes break."""
    pages_a = [a[i:i + ps] for i in range(0, len(a), ps)]
    pages_b = [b[i:i + ps] for i in range(0, len(b), ps)]
    if len(pages_a) == len(pages_b) and pages_a[-1] == pages_b[-1]:
        return ("Their last pages are equal but what comes before differs: a page's key must depend on every "
                "page before it too (the same tokens after a different beginning have different K/V)")
    if len(pages_a) == len(pages_b) and sorted(pages_a) == sorted(pages_b):
        return "They hold the same pages in a different order: a key must depend on where each page sits"
    if len(pages_a) != len(pages_b):
        return (f"They are {len(pages_a)} and {len(pages_b)} pages long: the key of page i must name the whole "
                "prefix, so a longer prefix gets a new key")
    return "They differ in their last page's tokens: every token of the page must change the key"


def _random_pages(rng, n, ps):
    return [rng.randrange(3, 500) for _ in range(n * ps)]


class CountedTokens:
    """A read-only sequence of token ids that counts the tokens read from it (an index reads one, a
    slice as many as it returns, iterating one per step). Handed to page_keys by the check: keys that
    re-read the whole prefix for every page read about n * pages / 2 tokens instead of about n."""

    def __init__(self, tokens):
        self._tokens = tuple(tokens)
        self.read = 0

    def __len__(self):
        return len(self._tokens)

    def __getitem__(self, index):
        got = self._tokens[index]
        if isinstance(index, slice):
            self.read += len(got)
            return list(got)
        self.read += 1
        return got

    def __iter__(self):
        return _CountedIterator(self)

    def __contains__(self, token):
        self.read += len(self._tokens)
        return token in self._tokens

    def __eq__(self, other):
        self.read += len(self._tokens)
        return list(self._tokens) == other

    __hash__ = None

    def __add__(self, other):
        self.read += len(self._tokens)
        return list(self._tokens) + list(other)

    def __radd__(self, other):
        self.read += len(self._tokens)
        return list(other) + list(self._tokens)

    def __repr__(self):
        return f"CountedTokens({len(self._tokens)} tokens)"

    def index(self, token, *args):
        self.read += len(self._tokens)
        return self._tokens.index(token, *args)

    def count(self, token):
        self.read += len(self._tokens)
        return self._tokens.count(token)


class _CountedIterator:
    def __init__(self, seq):
        self.seq, self.at = seq, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at >= len(self.seq._tokens):
            raise StopIteration
        self.at += 1
        self.seq.read += 1
        return self.seq._tokens[self.at - 1]


# page_keys may read each token a few times (a copy, a slice per page, a check of its input), never the
# whole prefix again for every page: a 48-page prompt read at most READS_PER_TOKEN times per token passes,
# while re-reading the prefix for every page reads about 32 times per token.
READS_PER_TOKEN = 4
LINEAR_PAGES = 48  # below the membrane's nesting limit (60), so a nested key crosses and is measured


def _size(key, depth=0) -> int:
    """How much data a key holds, in 8-byte words: an int by its bits, a str or bytes by its length,
    a tuple by its items (a nested key counted whole)."""
    if isinstance(key, (tuple, frozenset)) and depth < 50:
        return 1 + sum(_size(k, depth + 1) for k in key)
    if isinstance(key, int):
        return max(1, -(-key.bit_length() // 64))
    if isinstance(key, (str, bytes)):
        return max(1, -(-len(key) // 8))
    return 1


def _linear_work(impl, book, rng):
    """Keys cost about the same per page wherever the page sits: the tokens read, and each key's size."""
    for ps in (1, 2):
        tokens = _random_pages(rng, LINEAR_PAGES, ps)
        counted = CountedTokens(tokens)
        shown = f"page_keys(<a read-only sequence of {len(tokens)} tokens>, page_size={ps})"
        got = call(shown, impl, counted, ps)
        expect(type(got) in (list, tuple) and len(got) == LINEAR_PAGES,
               lambda: f"{shown} must return {LINEAR_PAGES} keys, got {kind_of(got)} "
                       f"{len(got) if type(got) in (list, tuple) else ''}", rule="one key per full page")
        reads = counted.read
        if reads > READS_PER_TOKEN * len(tokens) + 2 * ps:
            broke("linear work", f"{shown} read {reads} tokens from its input to key {LINEAR_PAGES} pages, "
                  f"{reads / len(tokens):.1f} per token (at most {READS_PER_TOKEN} allowed): it reads the whole prefix "
                  "again for every page, which is quadratic in the prompt's length. Carry one value from page to "
                  "page that stands for everything before it")
        got = list(got)
        small, big = _size(got[1]), _size(got[-1])
        if big > 2 * small + 8:
            broke("linear work", f"{shown}: the key of page {LINEAR_PAGES - 1} holds {big} words of data and the "
                  f"key of page 1 {small}: a key that grows with its position (the whole prefix, or every earlier "
                  "key nested inside it) costs a dict time and memory in proportion to the prefix at every lookup. "
                  "Summarise what comes before a page in a fixed-size value (a hash)")
        plain = book.keys(tokens, ps)  # the same tokens as a plain list: held to the other rules too
        expect(all(_plain_key(k) for k in got) and got == plain,
               f"{shown} returned other keys than for the same tokens in a plain list: a key may depend only on "
               "the tokens' values (whatever sequence holds them)", rule="a function of the prefix")


# What the student's code hashes grows in proportion to the prompt: keyed on 4x the pages, it hashes about 4x the
# data (plus what one call costs once). Re-hashing the whole prefix for every page hashes ~16x (96 pages against
# 24: 96 * 97 / 2 = 4656 tokens against 300), even after copying the input into a plain list first, which the
# counted reads of `_linear_work` cannot see. HASH_GROWTH sits between, with room for a per-page cost on top of
# the quadratic one (a 30-word digest per page still shows 7x).
HASH_PAGES = (24, 96)
HASH_GROWTH = 6
_AUTOGRADER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The autograder's own answers, mutants and controls stand where a student's code does.
_STUDENT_LIKE = tuple(os.path.join(_AUTOGRADER, folder) + os.sep for folder in ("reference", "mutants", "controls"))
_HASHLIB_NAMES = ("new", "md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "blake2s", "sha3_224",
                  "sha3_256", "sha3_384", "sha3_512")


def _nbytes(data) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return 0


def _from_student() -> bool:
    """Whether the hashing function was called by the student's code, not by the autograder's machinery (the
    membrane digests what crosses it with hashlib, and the check hashes the keys it is given)."""
    caller = sys._getframe(2).f_code.co_filename
    return not caller.startswith(_AUTOGRADER) or caller.startswith(_STUDENT_LIKE)


class _CountedDigest:
    """A hashlib object whose update() adds the bytes it is handed to the count."""

    def __init__(self, real, words):
        self._real, self._words = real, words

    def update(self, data):
        self._words[0] += -(-_nbytes(data) // 8)
        return self._real.update(data)

    def copy(self):
        return _CountedDigest(self._real.copy(), self._words)

    def __getattr__(self, name):
        return getattr(self._real, name)


@contextlib.contextmanager
def _hash_work():
    """[words]: how much data, in 8-byte words (`_size`), the student's code handed to the builtin `hash`,
    to hashlib's constructors and their update(), and to zlib's checksums, through their module names, in
    the block. Recorded as plain data (the student's code runs in the sandbox; the replay reads the record).
    Not seen: a function bound before the block (`from hashlib import sha256`), a tuple hashed by a dict or
    a set, numpy."""
    from ..recording.active import active_membrane

    active = active_membrane()
    with _checking._hooked("hash_work", [0], _checking._fill_counter) as words:
        if active is not None and active.mode == "replay":
            yield words
            return
        real_hash = builtins.hash
        real_hashlib = {name: getattr(hashlib, name) for name in _HASHLIB_NAMES if hasattr(hashlib, name)}
        real_zlib = {name: getattr(zlib, name) for name in ("crc32", "adler32")}

        def counted_hash(obj):
            if _from_student():
                words[0] += _size(obj)
            return real_hash(obj)

        def counted_constructor(real, data_at):
            def make(*args, **kwargs):
                digest = real(*args, **kwargs)
                if not _from_student():
                    return digest
                data = args[data_at] if len(args) > data_at else kwargs.get("data", kwargs.get("string", b""))
                words[0] += -(-_nbytes(data) // 8)
                return _CountedDigest(digest, words)
            return make

        def counted_checksum(real):
            def checksum(data, *args):
                if _from_student():
                    words[0] += -(-_nbytes(data) // 8)
                return real(data, *args)
            return checksum

        builtins.hash = counted_hash
        for name, real in real_hashlib.items():
            setattr(hashlib, name, counted_constructor(real, 1 if name == "new" else 0))
        for name, real in real_zlib.items():
            setattr(zlib, name, counted_checksum(real))
        try:
            yield words
        finally:
            builtins.hash = real_hash
            for name, real in real_hashlib.items():
                setattr(hashlib, name, real)
            for name, real in real_zlib.items():
                setattr(zlib, name, real)


def _hash_growth(book, rng):
    """The data hashed for 4x the pages grows about 4x, not 16x (whatever copy of its input the code hashes)."""
    for ps in (1, 2):
        hashed = []
        for pages in HASH_PAGES:
            tokens = _random_pages(rng, pages, ps)
            with _hash_work() as words:
                book.keys(tokens, ps)
            hashed.append(words[0])
        small, big = hashed
        if big > HASH_GROWTH * small + 64:
            broke("linear work", f"page_keys(..., page_size={ps}) hashed {big} words of data (8 bytes each) to key "
                  f"{HASH_PAGES[1]} pages and {small} to key {HASH_PAGES[0]}: {big / max(small, 1):.1f}x the data for "
                  f"{HASH_PAGES[1] // HASH_PAGES[0]}x the pages, so it hashes the whole prefix again for every page "
                  "(quadratic in the prompt's length), even if it reads each token once. Carry one value from page to "
                  "page that stands for everything before it, and hash only that value and the new page")


@check("page_keys")
def check_page_keys(impl, seed, allow_reference):
    rng = random.Random(seed)
    book = _KeyBook(impl)
    with forbid_calls("page_keys", _prefix_cache_module(), enabled=not allow_reference):
        # Counting: full pages only (the partial last page, a prompt shorter than a page, none at all).
        for tokens, ps in [([5, 6, 7, 8, 9, 10, 11], 2), ([1, 2, 3], 4), ([], 4), ([4, 4, 4, 4], 1),
                           (_random_pages(rng, 3, 4) + [7, 7, 7], 4), (_random_pages(rng, 2, 16), 16)]:
            book.keys(tokens, ps)
        for ps in (2, 3, 4):
            # Repeated pages: P, PP, PPP are different prefixes (a key of the page alone collides).
            page = [rng.randrange(3, 500) for _ in range(ps)]
            book.keys(page * 4, ps)
            # Swapped pages, and pages whose tokens are a permutation or have the same sum.
            p, q = [rng.randrange(3, 500) for _ in range(ps)], [rng.randrange(3, 500) for _ in range(ps)]
            book.keys(p + q, ps)
            book.keys(q + p, ps)
            book.keys(p[::-1] + q, ps)
            book.keys([p[0] + 1, p[1] - 1] + p[2:] + q, ps)
            # Every position of a chain: change one token of page j; keys before j stay, keys from j on change.
            n = 5
            base = _random_pages(rng, n, ps) + [9] * (ps - 1)
            keys = book.keys(base, ps)
            book.keys(base[:2 * ps], ps)  # a prefix of it: the same first keys, whatever follows
            book.keys(base[:3 * ps] + [1], ps)
            for j in range(n):
                changed = list(base)
                at = j * ps + rng.randrange(ps)
                changed[at] += 1
                other = book.keys(changed, ps)
                for i in range(n):
                    if i < j and other[i] != keys[i]:
                        broke("a function of the prefix",
                              f"page_keys(..., page_size={ps}): changing token {at} (in page {j}) changed the key of "
                              f"page {i}, which comes before it: {keys[i]!r} -> {other[i]!r}. A page's key may depend "
                              "only on its own page and the pages before it")
                    if i >= j and other[i] == keys[i]:
                        broke("different prefixes, different keys",
                              f"page_keys(..., page_size={ps}): changing token {at} (in page {j}) left the key of "
                              f"page {i} at {keys[i]!r}: "
                              + ("every token of the page must change its key" if i == j else
                                f"page {i}'s key must depend on page {j} before it (chain the keys), or two prompts "
                                "that differ early would share later pages"))
            # The same later pages after a different first page.
            tail = _random_pages(rng, 3, ps)
            book.keys(_random_pages(rng, 1, ps) + tail, ps)
            book.keys(_random_pages(rng, 1, ps) + tail, ps)
        # Keys cost about the same per page wherever it sits (counted on a sequence that counts its reads), and
        # the data hashed grows with the prompt, not with its square.
        _linear_work(impl, book, rng)
        _hash_growth(book, rng)


# ---------------------------------------------------------------------------------------------
# The prefix cache
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _colliding_hash(kind: str, target: tuple, victims: tuple = ()):
    """Swap builtins.hash for one that forces a collision while the cache runs.

    'tokens': a tuple equal to one of `victims` (probe pages) hashes like `target` (a registered
    page), also inside a bigger tuple such as (parent, tokens): the keys collide, the tokens differ.
    'parent': any tuple holding `target` hashes as if its other items were 0: the page's key ignores
    its parent, so the same tokens after another prefix collide."""
    real = builtins.hash

    def canon(obj):
        if isinstance(obj, tuple):
            if kind == "tokens" and obj in victims:
                return target
            if kind == "parent" and target in obj and obj != target:
                return tuple(x if x == target else 0 for x in obj)
            return tuple(canon(x) for x in obj)
        return obj

    def colliding(obj):
        return real(canon(obj))

    builtins.hash = colliding
    try:
        yield
    finally:
        builtins.hash = real


def _tokens(rng, n):
    return [rng.randrange(3, 500) for _ in range(n)]


class _Cache:
    """The student's cache on a course_lib BlockPool, with the calls narrated for messages."""

    def __init__(self, impl, num_pages=16, ps=4):
        self.pool = BlockPool(num_pages, ps)
        self.ps = ps
        self.cache = call(f"StudentPrefixCache(BlockPool({num_pages}, {ps}))", impl, self.pool)

    def register(self, page, parent, tokens):
        serial = call(f"register({page}, {parent}, {tuple(tokens)})", self.cache.register, page, parent, tuple(tokens))
        expect(type(serial) is int and serial != ROOT,
               lambda: f"StudentPrefixCache.register({page}, {parent}, ...) must return the page's serial (an int, "
                       f"never ROOT = 0, which means 'no parent'), got {show(serial)}")
        return serial

    def register_chain(self, tokens, pages=None, parent=ROOT, first=0):
        """Register the full pages of `tokens` from page `first` on, on fresh pages (as the engine does)."""
        n = len(tokens) // self.ps - first
        pages = pages if pages is not None else self.pool.allocate(n)
        serials = []
        for i, page in enumerate(pages):
            chunk = tokens[(first + i) * self.ps:(first + i + 1) * self.ps]
            parent = self.register(page, parent, chunk)
            serials.append(parent)
        return list(pages), serials

    def lookup(self, tokens, max_pages):
        shown = f"lookup({_short(tokens)}, max_pages={max_pages})"
        before = (list(self.pool.ref_counts), [p for p in range(self.pool.num_pages) if self.pool.is_free(p)])
        result = call(shown, self.cache.lookup, list(tokens), max_pages)
        after = (list(self.pool.ref_counts), [p for p in range(self.pool.num_pages) if self.pool.is_free(p)])
        if after != before:
            changed = [p for p in range(self.pool.num_pages) if before[0][p] != after[0][p]]
            broke("looking up changes nothing", f"{NAME}.{shown} changed the pool: reference counts of pages "
                  f"{changed} went from {[before[0][p] for p in changed]} to {[after[0][p] for p in changed]} "
                  f"(free pages {len(before[1])} -> {len(after[1])}). A lookup only answers: the KV manager calls "
                  "pool.share on the pages it keeps (it may ask again every step while the request waits, and "
                  "keep fewer pages than you found)")
        expect(type(result) is tuple and len(result) == 2,
               lambda: f"StudentPrefixCache.lookup must return (pages, serial), got {kind_of(result)} {show(result)}")
        pages, serial = result
        ints = [plain_int(p) for p in pages] if type(pages) in (list, tuple) else [None]
        expect(None not in ints and plain_int(serial) is not None,
               lambda: f"StudentPrefixCache.lookup must return (pages, serial): a list of page ids and an int, got "
                       f"{show(result)}")
        return ints, plain_int(serial)

    def is_cached(self, page):
        return bool(call(f"is_cached({page})", self.cache.is_cached, page))


NAME = "StudentPrefixCache"


def _counters(impl):
    c = _Cache(impl)
    cache = c.cache
    for attr in ("queried_tokens", "hit_tokens"):
        expect(getattr(cache, attr, None) == 0, f"{NAME} must start with {attr} = 0 (the engine adds to it), got "
                                                f"{getattr(cache, attr, None)!r}")
    rate = call("hit_rate", lambda: cache.hit_rate)
    expect(rate == 0.0, f"{NAME}.hit_rate must be 0.0 before any prompt was queried (queried_tokens = 0), got {rate!r}")
    for queried, hits in [(40, 10), (3, 1), (7, 7), (5, 0)]:
        cache.queried_tokens, cache.hit_tokens = queried, hits
        rate = call("hit_rate", lambda: cache.hit_rate)
        expect(same_float(rate, hits / queried) and isinstance(rate, float),
               f"{NAME}.hit_rate with queried_tokens = {queried}, hit_tokens = {hits} must be the fraction of "
               f"queried prompt tokens that hit, {hits / queried!r}, got {rate!r}")
    cache.queried_tokens = cache.hit_tokens = 0


def _lookups(impl, rng):
    c = _Cache(impl)
    a = _tokens(rng, 14)  # 3 full pages + 2 tokens
    pages, serials = c.register_chain(a)
    for p in pages:
        expect(c.is_cached(p), f"{NAME}.is_cached({p}) must be True after register({p}, ...)")
    expect(len(set(serials)) == 3, f"{NAME}.register must give each registered page a serial of its own, got {serials}")
    got, serial = c.lookup(a, 3)
    expect(got == pages, f"{NAME}: after registering prompt A's pages {pages} (a chain from ROOT), lookup(A, "
                         f"max_pages=3) must return them all, got {got}")
    expect(serial == serials[-1], f"{NAME}.lookup must return the serial of the last page found ({serials[-1]}, what "
                                  f"register returned for page {pages[-1]}), got {serial!r}: the engine chains the "
                                  "request's next pages from it")
    for m in (2, 1, 0):
        got, serial = c.lookup(a, m)
        want = (pages[:m], serials[m - 1] if m else ROOT)
        expect((got, serial) == want, f"{NAME}: lookup(A, max_pages={m}) must stop after {m} page(s): expected "
                                      f"{want}, got ({got}, {serial})")
    # The partial last page: A cut in the middle of its third page never matches that page.
    got, _ = c.lookup(a[:10], 3)
    expect(got == pages[:2], f"{NAME}: lookup(A[:10], max_pages=3) must return only the 2 pages A[:10] fills "
                             f"completely, {pages[:2]}; got {got}. The third page holds 2 of its 4 tokens: a page "
                             "matches only if all its tokens are equal")
    b = a[:4] + _tokens(rng, 4) + a[8:]  # page 1 differs, page 2 is A's page 2 again
    got, serial = c.lookup(b, 3)
    expect(got == pages[:1] and serial == serials[0],
           f"{NAME}: a prompt that shares only A's first page must hit exactly {pages[:1]} (serial {serials[0]}); "
           f"got ({got}, {serial}). A lookup stops at the first miss: a later page with the same tokens belongs "
           "to a different prefix")
    # A page registered after A's first page under another second page: reachable only through that page.
    other = _tokens(rng, 4)
    c.register_chain(a[:4] + other, parent=serials[0], first=1)
    got, _ = c.lookup(a[:4] + _tokens(rng, 4) + other, 3)
    expect(got == pages[:1], f"{NAME}: lookup must stop at the first miss, but after missing page 1 it went on and "
                             f"returned {got} (expected {pages[:1]}): a page only counts if every page before it hit")
    # The same tokens as A's page 1, but registered after ANOTHER first page: not A's prefix.
    x = _tokens(rng, 4)
    px, _ = c.register_chain(x + a[4:8])
    got, _ = c.lookup(x + a[4:12], 3)
    expect(got == px, f"{NAME}: prompt X + A's pages 1-2: X and A's page 1 were registered as a chain from X, so "
                      f"lookup must return {px}, got {got} (A's page 2 hangs under A's page 1, not under X's)")
    got, serial = c.lookup(_tokens(rng, 12), 3)
    expect(got == [] and serial == ROOT, f"{NAME}: an unseen prompt must miss: expected ([], 0), got ({got}, {serial})")
    # The same page computed again by another request at the same time: the first copy stays the cached one.
    dup = c.pool.allocate(1)[0]
    again = c.register(dup, ROOT, a[:4])
    expect(again == serials[0], f"{NAME}.register of a page identical to cached page {pages[0]} (same parent ROOT, "
                                f"same tokens) must return that page's serial {serials[0]}, got {again!r}: the "
                                "request's next pages then chain onto the cached copy", rule="duplicates")
    expect(not c.is_cached(dup), f"{NAME}: a duplicate page ({dup}, same prefix as cached page {pages[0]}) must stay "
                                 f"uncached (is_cached({dup}) must be False): it is freed with its request",
           rule="duplicates")
    got, _ = c.lookup(a, 3)
    expect(got == pages, f"{NAME}: after registering a duplicate of page {pages[0]}, lookup(A) must still return "
                         f"{pages}, got {got}", rule="duplicates")


def _eviction(impl, rng):
    """Through the pool's hooks: cached pages are freed to the back of the queue, evicted when reused,
    and an evicted prefix can be registered again (on a new page, or the same physical page)."""
    c = _Cache(impl, num_pages=8)
    pool = c.pool
    a = _tokens(rng, 12)
    pages, serials = c.register_chain(a)  # pages 0, 1, 2
    blank = pool.allocate(2)  # pages 3, 4
    pool.free(pages + blank)
    reused = pool.allocate(3)[0]
    expect(reused in blank, f"{NAME}: after freeing the 3 cached pages {pages} and 2 uncached ones {blank}, the pool "
                            f"reused page {reused} first: the pool asks pool.is_cached(page) to keep cached pages at "
                            "the back of its free queue. Install your is_cached on the pool in __init__")
    # 3 blank (and never used) pages are taken first; the next allocation reuses A's pages, tail first.
    left = pool.allocate(pool.num_free_pages - 3)
    first_evicted = pool.allocate(1)[0]
    expect(first_evicted == pages[2], f"{NAME} (internal): expected the pool to reuse page {pages[2]} next, got {first_evicted}")
    expect(not c.is_cached(pages[2]), f"{NAME}: the pool reused cached page {pages[2]} (it calls pool.on_evict({pages[2]}) "
                                      f"just before): is_cached({pages[2]}) must now be False. Install your evict as "
                                      "pool.on_evict in __init__")
    got, serial = c.lookup(a, 3)
    expect(got == pages[:2] and serial == serials[1],
           f"{NAME}: after the pool evicted A's page 2 ({pages[2]}), lookup(A, 3) must return the 2 pages still cached, "
           f"({pages[:2]}, {serials[1]}); got ({got}, {serial})")
    # Re-register the evicted page's prefix on the same physical page (the pool handed it to a request
    # that computed A again): it must be found again.
    again = c.register(first_evicted, serials[1], a[8:12])
    got, serial = c.lookup(a, 3)
    expect(got == pages and serial == again,
           f"{NAME}: A's page 2 was evicted, then computed again on page {first_evicted} and registered (serial "
           f"{again}): lookup(A, 3) must find it again, expected ({pages}, {again}), got ({got}, {serial}). Evicting "
           "must forget the page's key too, or the re-registered prefix looks like a duplicate of a page that is gone")
    # Evict page 1 directly (as the pool would); re-register its prefix on another page.
    pool.free(left[:1])
    call(f"evict({pages[1]})", c.cache.evict, pages[1])
    expect(not c.is_cached(pages[1]), f"{NAME}.is_cached({pages[1]}) must be False after evict({pages[1]})")
    got, _ = c.lookup(a, 3)
    expect(got == pages[:1], f"{NAME}: after evict({pages[1]}), lookup(A, 3) must return only {pages[:1]} (the chain "
                             f"breaks at the evicted page), got {got}")
    new = pool.allocate(1)[0]
    s1 = c.register(new, serials[0], a[4:8])
    expect(c.is_cached(new), f"{NAME}: A's page 1 was evicted, then registered again on page {new}: is_cached({new}) "
                             "must be True (the key is free again: this is not a duplicate)")
    got, serial = c.lookup(a, 3)
    expect(got == [pages[0], new] and serial == s1,
           f"{NAME}: after re-registering A's page 1 on page {new}, lookup(A, 3) must return ([{pages[0]}, {new}], {s1}) "
           f"(A's old page 2 hangs under the evicted page's serial, so it is no longer reachable); got ({got}, {serial})")


def _stale_after_reuse(impl, rng):
    """A page evicted and reused for ANOTHER prefix: nothing of its old entry may be found again. Its old
    children hang under a serial that is gone (serials are never reused, even for the same physical
    page), and a lookup of its old prefix must not find the page that now holds other tokens."""
    c = _Cache(impl, num_pages=8)
    pool = c.pool
    a, b = _tokens(rng, 8), _tokens(rng, 4)
    pages, serials = c.register_chain(a)  # A's pages 0 and 1 (page 1 hangs under page 0's serial)
    pool.free(pages[:1])  # page 0 first: it is at the front of the cached free pages, evicted first
    pool.free(pages[1:])
    pool.allocate(pool.num_pages - 2)  # the blank pages
    reused = pool.allocate(1)[0]
    expect(reused == pages[0] and not c.is_cached(reused),
           f"{NAME}: the pool evicted and reused A's page 0 ({pages[0]}): is_cached({pages[0]}) must be False after "
           "pool.on_evict; install your evict as pool.on_evict in __init__", rule="forget evicted pages")
    fresh = c.register(reused, ROOT, b)  # B's first page, computed on the physical page A's page 0 had
    expect(fresh not in serials, f"{NAME}: page {reused} was evicted (it held A's page 0, serial {serials[0]}) and "
                                 f"registered again with other tokens {tuple(b)}: register returned {fresh}, a serial "
                                 f"A's pages already had ({serials}). A serial names one registration, never reused "
                                 "(not the page number): A's page 1 still hangs under the old one, and would now be "
                                 "found after B's page", rule="fresh serials")
    got, serial = c.lookup(b + a[4:8], 2)
    expect(got == [reused] and serial == fresh,
           f"{NAME}: after A's page 0 ({pages[0]}) was evicted and the page reused for B's first page (serial {fresh}), "
           f"lookup(B's page + A's page 1, 2) must return ([{reused}], {fresh}); got ({got}, {serial}). A's page 1 "
           f"({pages[1]}) belongs after A's page 0, which is gone: it is a stale child, and B's page is not its parent",
           rule="fresh serials")
    # The other way round: A's page 1 evicted and reused for C, while A's page 0 is still cached.
    c = _Cache(impl, num_pages=8)
    pool = c.pool
    a, x = _tokens(rng, 8), _tokens(rng, 4)
    pages, serials = c.register_chain(a)
    pool.free(pages[1:])
    pool.free(pages[:1])
    pool.allocate(pool.num_pages - 2)
    reused = pool.allocate(1)[0]
    expect(reused == pages[1] and not c.is_cached(reused),
           f"{NAME}: the pool evicted and reused A's page 1 ({pages[1]}): is_cached({pages[1]}) must be False after "
           "pool.on_evict", rule="forget evicted pages")
    other = c.register(reused, ROOT, x)  # now it holds C's first page, and is cached again
    got, serial = c.lookup(a, 2)
    expect(got == pages[:1] and serial == serials[0],
           f"{NAME}: A's page 1 ({pages[1]}) was evicted, and the pool reused the page for another prompt's first "
           f"page {tuple(x)} (registered, serial {other}, so the page is cached again). lookup(A, 2) must return "
           f"({pages[:1]}, {serials[0]}); got ({got}, {serial}): an entry of an evicted page must be forgotten, not "
           "kept and trusted because its page number is cached again (it holds other tokens now)",
           rule="forget evicted pages")


def _collisions(impl, rng):
    """Hash collisions at every position k of a chain, looked up and registered: on the page's tokens
    (probe pages one token below and above the cached page's, so that neither order of comparison
    passes for equality), and on the parent (the same tokens after a chain registered before the
    cached one, and after one registered after it)."""
    n = 4
    for k in range(n):
        _token_collision(impl, rng, n, k)
        if k:
            _parent_collision(impl, rng, n, k)


def _token_collision(impl, rng, n, k):
    c = _Cache(impl)
    x = _tokens(rng, 4 * n)
    px, sx = c.register_chain(x)
    parent = sx[k - 1] if k else ROOT
    page = tuple(x[4 * k:4 * (k + 1)])
    victims = ((page[0] - 1,) + page[1:], (page[0] + 1,) + page[1:])  # below and above it in tuple order
    sibling = None
    if k + 1 < n:  # X's page k + 1 tokens, registered right under X's page k - 1: reachable only past a miss
        sibling = c.pool.allocate(1)[0]
        c.register(sibling, parent, x[4 * (k + 1):4 * (k + 2)])
    with _colliding_hash("tokens", page, victims):
        for victim in victims:
            probe = x[:4 * k] + list(victim) + x[4 * (k + 1):]
            got, _ = c.lookup(probe, n)
            if got == px[:k]:
                continue
            if got[:k] == px[:k] and sibling in got[k:]:
                fail(f"{NAME}: X's pages are {px}. A probe equal to X except in page {k} ({victim}, whose hash was "
                     f"forced equal to X's page {k} {page}) was looked up: expected {px[:k]}, got {got}. The key of "
                     f"page {k} matched but its tokens did not, and the lookup went on to page {sibling} (registered "
                     f"with X's page {k + 1} tokens right after X's page {k - 1}). A failed confirmation is a miss: "
                     "the lookup stops there")
            fail(f"{NAME}: X's pages are {px}. A probe equal to X except in page {k}, whose tokens {victim} differ from "
                 f"X's page {k} {page} but hash the same (forced collision), was looked up: expected {px[:k]}, got "
                 f"{got}. Every hit must be confirmed against the page's stored tokens: hash collisions happen, and a "
                 "key match alone is not proof")
        for victim in victims:
            new = c.pool.allocate(1)[0]
            serial = c.register(new, parent, victim)
            if serial == sx[k]:
                fail(f"{NAME}: X's page {k} (page {px[k]}, tokens {page}, parent {parent}) is cached with serial "
                     f"{sx[k]}. register({new}, {parent}, {victim}), whose tokens differ but hash the same (forced "
                     f"collision), returned {serial}, the serial of page {px[k]}: only a page with the same parent AND "
                     "the same tokens is a duplicate; a colliding page gets an identity of its own (the pages "
                     f"computed after it are not page {px[k]}'s successors)")
            got, _ = c.lookup(x, n)
            expect(got == px, f"{NAME}: after register({new}, {parent}, {victim}), a page whose hash collides with "
                              f"X's page {k} {page} (forced), lookup(X) must still return X's pages {px}, got {got}: a "
                              "colliding page must not replace or hide the cached one")
            got, _ = c.lookup(x[:4 * k] + list(victim), n)
            expect(got in (px[:k], px[:k] + [new]),
                   f"{NAME}: X's pages are {px}; page {new} was registered with tokens {victim} after X's first {k} "
                   f"page(s), while its hash collided with X's page {k} (forced). Looking up X[:{k} pages] + {victim} "
                   f"must return {px[:k]} (the colliding page kept private) or {px[:k] + [new]} (kept apart from X's "
                   f"page {k}), got {got}")


def _parent_collision(impl, rng, n, k):
    """X's page k tokens after W's first k pages (W registered before X) and after Y's (after X)."""
    c = _Cache(impl)  # registered while the parent-blind hash is in force, so that the keys collide
    w, x, y = _tokens(rng, 4 * n), _tokens(rng, 4 * n), _tokens(rng, 4 * n)
    page = tuple(x[4 * k:4 * (k + 1)])
    with _colliding_hash("parent", page):
        (pw, sw), (px, sx), (py, sy) = c.register_chain(w), c.register_chain(x), c.register_chain(y)
        for name, other, pages in (("W", w, pw), ("Y", y, py)):
            got, _ = c.lookup(other[:4 * k] + x[4 * k:], n)
            if got != pages[:k]:
                fail(f"{NAME}: W's pages are {pw}, X's {px}, Y's {py} (registered in that order). The probe "
                     f"{name}[:{k} pages] + X[page {k}:] was looked up while the hash of page {k} ignored its parent "
                     f"(forced collision with X's page {k}): expected {name}'s {pages[:k]}, got {got}. A hit must "
                     f"also confirm the entry's stored parent serial (equal, not ordered): X's page {k} hangs under "
                     f"X's page {k - 1}, not under {name}'s")
        for name, serials in (("W", sw), ("Y", sy)):
            new = c.pool.allocate(1)[0]
            serial = c.register(new, serials[k - 1], page)
            if serial == sx[k]:
                fail(f"{NAME}: X's page {k} (page {px[k]}, tokens {page}) is cached under parent {sx[k - 1]} with "
                     f"serial {sx[k]}. register({new}, {serials[k - 1]}, {page}), the same tokens after {name}'s page "
                     f"{k - 1} while the hash ignored the parent (forced collision), returned {serial}, the serial of "
                     f"page {px[k]}: only a page with the same parent AND the same tokens is a duplicate (compare "
                     "the parents for equality); a colliding page gets an identity of its own")
            got, _ = c.lookup(x, n)
            expect(got == px, f"{NAME}: after register({new}, {serials[k - 1]}, {page}) (X's page {k} tokens after "
                              f"{name}'s page {k - 1}, hash forced to collide), lookup(X) must still return {px}, "
                              f"got {got}")


def _engine_run(cache_factory, seed, waves):
    model = fixtures.random_model(seed)
    pool = BlockPool(16, 4)
    cache = cache_factory(pool)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=16, max_num_seqs=4, max_num_batched_tokens=32,
                                           admission="none", enable_prefix_caching=True),
                       block_pool=pool, prefix_cache=cache)
    evictions = [0]
    hook = pool.on_evict

    def counting(page):
        evictions[0] += 1
        hook(page)

    if hook is not None:
        pool.on_evict = counting
    return model, engine, cache, evictions


def _engine(impl, seed, allow):
    from course_lib.kv.prefix_cache import PrefixCache

    rng = random.Random(seed)
    vocab = fixtures.SMALL_SHAPE["vocab_size"]
    shared = fixtures.random_prompts(rng, 1, vocab, lo=9, hi=11)[0]
    waves = [[shared + fixtures.random_prompts(rng, 1, vocab, lo=1, hi=6)[0] for _ in range(3)] for _ in range(2)]
    waves.append(fixtures.random_prompts(rng, 2, vocab, lo=10, hi=16))  # unrelated: forces evictions
    waves.append([shared + fixtures.random_prompts(rng, 1, vocab, lo=1, hi=6)[0] for _ in range(2)])
    runs = {}
    for who, factory in (("yours", lambda pool: call(f"{NAME}(pool)", impl, pool)), ("course_lib", PrefixCache)):
        model, engine, cache, evictions = _engine_run(factory, seed, waves)
        k = 0
        for wave in waves:
            want = fixtures.greedy(model, wave, 6) if who == "yours" else None
            ids = []
            for p in wave:
                ids.append(engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{k}"))
                k += 1
            with forbid_calls(NAME, _prefix_cache_module(), enabled=(who == "yours" and not allow)):
                drive(engine, f"{NAME} (serving shared prefixes from a 16-page pool)", max_steps=300)
            for rid, p, w in zip(ids, wave, want or [None] * len(ids)):
                got = engine.requests[rid].output_token_ids
                if w is not None and got != w:
                    fail(f"{NAME}: serving a float64 model with prefix caching, request {rid} (prompt {_short(p)}) "
                         f"produced {got} instead of the model's greedy answer {w}: a lookup returned a page whose "
                         "contents are not this prompt's (an unconfirmed hit, or a stale entry of an evicted page)")
        runs[who] = (engine, cache, evictions[0])
    (mine, cache, _), (theirs, ref, ref_evictions) = runs["yours"], runs["course_lib"]
    expect(ref_evictions > 0, f"{NAME} (internal): the engine run evicted no cached page")
    expect(cache.hit_tokens > 0, f"{NAME}: requests sharing a {len(shared)}-token prefix were served but the cache "
                                 "never hit (hit_tokens == 0): lookup must find the pages registered before",
           rule="longest prefix")
    per_request = {rid: r.num_cached_tokens for rid, r in mine.requests.items()}
    want_per_request = {rid: r.num_cached_tokens for rid, r in theirs.requests.items()}
    if per_request != want_per_request:
        diff = {rid: (per_request[rid], w) for rid, w in want_per_request.items() if per_request[rid] != w}
        broke("longest prefix",
              f"{NAME}: served through the engine (4 waves of requests sharing a {len(shared)}-token prefix, a 16-page "
              f"pool of 4-token pages that evicts {ref_evictions} cached pages), some requests found a different number "
              f"of cached prompt tokens than with a correct cache: request: (yours, expected) {diff}. A correct cache "
              "finds every registered page of the prompt's prefix that has not been evicted, and no other")
    for attr in ("queried_tokens", "hit_tokens"):
        got, want = getattr(cache, attr), getattr(ref, attr)
        expect(got == want, f"{NAME}: after serving the same requests, {attr} = {got!r}, expected {want!r}: the engine "
                            f"adds to the counters itself (once per admitted request), so the cache must only start "
                            "them at 0 and never change them (a lookup is also asked while a request waits)",
               rule="exact counters")
    rate = cache.hit_rate
    expect(same_float(rate, ref.hit_rate), f"{NAME}: after serving, hit_rate = {rate!r}, expected "
                                           f"{ref.hit_tokens} / {ref.queried_tokens} = {ref.hit_rate!r}",
           rule="exact counters")


@check("StudentPrefixCache", forbidden=_prefix_cache_class)
def check_StudentPrefixCache(impl, seed, allow_reference):
    expect(isinstance(impl, type), f"{NAME} must be a class, got {type(impl).__name__}")
    rng = random.Random(seed)
    with forbid_calls(NAME, _prefix_cache_module(), enabled=not allow_reference):
        with naming_rule("exact counters"):
            _counters(impl)
        with naming_rule("longest prefix"):
            _lookups(impl, rng)
        with naming_rule("forget evicted pages"):
            _eviction(impl, rng)
        with naming_rule("never a wrong page"):
            _collisions(impl, rng)
        _stale_after_reuse(impl, rng)
    with naming_rule("never a wrong page"):
        _engine(impl, seed, allow_reference)
