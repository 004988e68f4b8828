"""Notebook 06, `page_keys`: one key per full page, each a function of its whole prefix, and work that
grows linearly with the prompt (tokens read, key sizes, data hashed)."""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import random
import sys
import zlib

from autograder import _checking
from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, show

from ._shared import _prefix_cache_module, _short


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
    from autograder.recording.active import active_membrane

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
