"""Notebook 06, `StudentPrefixCache`: the cache on its own, under forced hash collisions, and inside
the real engine with evictions, against course_lib's counters."""
from __future__ import annotations

import builtins
import contextlib
import random

from autograder import fixtures
from autograder._checking import (broke, call, check, drive, expect, fail, forbid_calls, kind_of, naming_rule,
                                  plain_int, same_float, show)
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool

from ._shared import _prefix_cache_module, _short

ROOT = 0


def _prefix_cache_class():
    from course_lib.kv.prefix_cache import PrefixCache

    return (PrefixCache,)


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
