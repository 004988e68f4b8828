"""Checks for notebook 06 (prefix caching): chained page keys, and the prefix cache.

The cache is checked on its own (register a chain, look it up, diverge, evict, count), under
forced hash collisions (the builtin `hash` is swapped for one that collides while the cache
runs, so an unconfirmed hit shows up as a wrong page), and inside the real engine: a float64
model serves prompts that share prefixes from a pool small enough that cached pages get evicted
and reused; greedy tokens must not change, and the cache must actually hit.
"""
from __future__ import annotations

import builtins
import contextlib
import random

from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool

from .. import fixtures
from .._checking import call, check, drive, expect, fail, forbid_calls

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


def _keys(tokens, ps, parent=0):
    keys = []
    for i in range(len(tokens) // ps):
        parent = hash((parent, tuple(tokens[i * ps:(i + 1) * ps])))
        keys.append(parent)
    return keys


@check("page_keys")
def check_page_keys(impl, seed, allow_reference):
    rng = random.Random(seed)
    cases = [([5, 6, 7, 8, 9, 10, 11], 2), ([1, 2, 3], 4), ([], 4), ([4, 4, 4, 4], 1)]
    for _ in range(3):
        ps = rng.choice([2, 3, 4, 16])
        cases.append(([rng.randrange(3, 500) for _ in range(rng.randint(ps, 6 * ps))], ps))
    with forbid_calls("page_keys", _prefix_cache_module(), enabled=not allow_reference):
        for tokens, ps in cases:
            shown = f"page_keys({tokens}, page_size={ps})"
            got = call(shown, impl, list(tokens), ps)
            want = _keys(tokens, ps)
            expect(isinstance(got, (list, tuple)), f"{shown} must return a list of keys, got {type(got).__name__}")
            got = list(got)
            if got == want:
                continue
            full = len(tokens) // ps
            if len(got) == full + 1 and got[:full] == want:
                fail(f"{shown}: only FULL pages get a key ({full} here); the last {len(tokens) % ps} tokens do not "
                     "fill a page yet")
            if len(got) != full:
                fail(f"{shown} returned {len(got)} keys, expected one per full page: {full}")
            unchained = [hash(tuple(tokens[i * ps:(i + 1) * ps])) for i in range(full)]
            if got == unchained:
                fail(f"{shown}: key of page 1 does not depend on page 0's key: keys must be chained, "
                     "key_i = hash((key_{i-1}, tuple(page_i))), so equal pages after different prefixes differ")
            if got == _keys(tokens, ps, parent=None):
                fail(f"{shown}: the chain must start from key_-1 = 0 (got keys chained from None)")
            first_wrong = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
            fail(f"{shown}: key {first_wrong} is {got[first_wrong]}, expected {want[first_wrong]} = "
                 f"hash(({'0' if first_wrong == 0 else f'key_{first_wrong - 1}'}, "
                 f"{tuple(tokens[first_wrong * ps:(first_wrong + 1) * ps])}))")
    # Chained: changing page 1 must change every later key, not page 0's.
    tokens = [rng.randrange(3, 500) for _ in range(12)]
    a = list(call("page_keys", impl, tokens, 4))
    b = list(call("page_keys", impl, tokens[:4] + [t + 1 for t in tokens[4:8]] + tokens[8:], 4))
    expect(a[0] == b[0], "page_keys: changing page 1 changed page 0's key")
    expect(a[2] != b[2], "page_keys: key of page 2 does not depend on page 1's key: keys must be chained")


# ---------------------------------------------------------------------------------------------
# The prefix cache
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _patched_hash(kind: str):
    """Make collisions happen: 'constant' (every key equal) or 'unchained' (the parent is ignored)."""
    real = builtins.hash

    def constant(obj):
        real(obj)  # still raise TypeError for unhashable things
        return 7

    def unchained(obj):
        if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], tuple):
            return real(obj[1])
        return real(obj)

    builtins.hash = constant if kind == "constant" else unchained
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

    def register_chain(self, tokens, pages=None):
        """Register the full pages of `tokens` on fresh pages (as the engine does); returns (pages, serials)."""
        n = len(tokens) // self.ps
        pages = pages if pages is not None else self.pool.allocate(n)
        serials, parent = [], ROOT
        for i, page in enumerate(pages):
            chunk = tuple(tokens[i * self.ps:(i + 1) * self.ps])
            parent = call(f"register({page}, {parent}, {chunk})", self.cache.register, page, parent, chunk)
            expect(isinstance(parent, int) and parent != ROOT,
                   f"StudentPrefixCache.register must return the page's serial (a new int, never ROOT=0), got {parent!r}")
            serials.append(parent)
        return list(pages), serials

    def lookup(self, tokens, max_pages):
        result = call(f"lookup(<{len(tokens)} tokens>, max_pages={max_pages})", self.cache.lookup, list(tokens), max_pages)
        expect(isinstance(result, tuple) and len(result) == 2,
               f"StudentPrefixCache.lookup must return (pages, serial), got {result!r:.80}")
        return list(result[0]), result[1]


def _unit(impl, rng):
    name = "StudentPrefixCache"
    c = _Cache(impl)
    cache, pool = c.cache, c.pool
    expect(pool.is_cached == cache.is_cached and pool.on_evict == cache.evict,
           f"{name}(pool) must install its hooks on the pool: pool.is_cached = self.is_cached and "
           "pool.on_evict = self.evict (the pool calls evict before it reuses a cached page)")
    for attr in ("queried_tokens", "hit_tokens"):
        expect(getattr(cache, attr, None) == 0, f"{name} must start with {attr} = 0 (the engine adds to it)")
    expect(cache.hit_rate == 0.0, f"{name}.hit_rate must be 0.0 before any query, got {cache.hit_rate!r}")
    cache.queried_tokens, cache.hit_tokens = 40, 10
    expect(cache.hit_rate == 0.25, f"{name}.hit_rate must be hit_tokens / queried_tokens (10 / 40 = 0.25), got "
                                   f"{cache.hit_rate!r}")
    cache.queried_tokens = cache.hit_tokens = 0

    a = _tokens(rng, 14)  # 3 full pages + 2 tokens
    pages, serials = c.register_chain(a)
    for p in pages:
        expect(cache.is_cached(p), f"{name}.is_cached({p}) must be True after register({p}, ...)")
    got, serial = c.lookup(a, 3)
    expect(got == pages, f"{name}: after registering prompt A's pages {pages}, lookup(A, max_pages=3) returned {got}")
    expect(serial == serials[-1], f"{name}.lookup must return the serial of the last page found ({serials[-1]}, what "
                                  f"register returned for page {pages[-1]}), got {serial!r}: the engine chains the "
                                  "next pages of the request from it")
    got, serial = c.lookup(a, 2)
    expect(got == pages[:2] and serial == serials[1],
           f"{name}: lookup(A, max_pages=2) must stop after 2 pages: expected ({pages[:2]}, {serials[1]}), got ({got}, {serial})")
    b = a[:4] + _tokens(rng, 4) + a[8:]  # page 1 differs, page 2 is A's page 2 again
    got, serial = c.lookup(b, 3)
    expect(got == pages[:1] and serial == serials[0],
           f"{name}: a prompt that shares only A's first page must hit exactly {pages[:1]} (serial {serials[0]}); "
           f"got ({got}, {serial}). A lookup stops at the first miss: a later page with the same tokens belongs "
           "to a different prefix")
    # A page cached after A's first page, under another second page: reachable only through that page.
    other = _tokens(rng, 4)
    extra, _ = c.register_chain(a[:4] + other)
    got, serial = c.lookup(a[:4] + _tokens(rng, 4) + other, 3)
    expect(got == pages[:1], f"{name}: lookup must stop at the first miss, but after missing page 1 it went on and "
                             f"returned {got} (expected {pages[:1]}): a page only counts if every page before it hit")
    got, serial = c.lookup(_tokens(rng, 12), 3)
    expect(got == [] and serial == ROOT, f"{name}: an unseen prompt must miss: expected ([], 0), got ({got}, {serial})")
    # The same pages computed again by another request: the first copy stays the cached one.
    dup = pool.allocate(1)[0]
    again = call("register", cache.register, dup, ROOT, tuple(a[:4]))
    expect(again == serials[0], f"{name}.register of a page identical to cached page {pages[0]} (same parent, same "
                                f"tokens) must return that page's serial {serials[0]}, got {again!r}")
    got, _ = c.lookup(a, 1)
    expect(got == pages[:1], f"{name}: after registering a duplicate of page {pages[0]}, lookup must still return "
                             f"{pages[:1]}, got {got}")
    # Eviction: the pool reuses page 1 of A.
    call(f"evict({pages[1]})", cache.evict, pages[1])
    expect(not cache.is_cached(pages[1]), f"{name}.is_cached({pages[1]}) must be False after evict({pages[1]})")
    got, _ = c.lookup(a, 3)
    expect(got == pages[:1], f"{name}: after evict({pages[1]}), lookup(A) must return only {pages[:1]} (the chain "
                             f"breaks at the evicted page), got {got}")
    # Through the pool: freeing everything and allocating the whole pool evicts every cached page.
    pool.free(pages + [dup] + extra)
    pool.allocate(pool.num_pages)
    got, _ = c.lookup(a, 3)
    expect(got == [], f"{name}: after the pool reused every page (calling on_evict for each cached one), lookup(A) "
                      f"must miss, got {got}")


def _collisions(impl, rng):
    name = "StudentPrefixCache"
    for kind in ("constant", "unchained"):
        c = _Cache(impl)
        x, y = _tokens(rng, 8), _tokens(rng, 8)
        with _patched_hash(kind):
            px, _ = c.register_chain(x)
            py, _ = c.register_chain(y)
            probes = [(_tokens(rng, 8), [], "an unseen prompt"), (x[:4] + y[4:], px[:1], "X's first page + Y's second page")]
            for tokens, want, label in probes:
                got, _ = c.lookup(tokens, 2)
                if got != want:
                    what = "tokens" if kind == "constant" else "parent"
                    fail(f"{name}: with colliding hashes, lookup of {label} returned pages {got} instead of {want}: "
                         f"every hit must be confirmed against the page's stored {what} "
                         + ("(hash collisions happen: a key match alone is not proof)" if what == "tokens" else
                            "(its parent serial must be the serial of the page before it)"))


def _engine(impl, seed, allow):
    name = "StudentPrefixCache"
    rng = random.Random(seed)
    model = fixtures.random_model(seed)
    vocab = model.config.vocab_size
    shared = fixtures.random_prompts(rng, 1, vocab, lo=9, hi=11)[0]
    waves = [[shared + fixtures.random_prompts(rng, 1, vocab, lo=1, hi=6)[0] for _ in range(3)] for _ in range(2)]
    waves.append(fixtures.random_prompts(rng, 2, vocab, lo=10, hi=16))  # unrelated: forces evictions
    waves.append([shared + fixtures.random_prompts(rng, 1, vocab, lo=1, hi=6)[0] for _ in range(2)])
    pool = BlockPool(16, 4)
    cache = impl(pool)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=16, max_num_seqs=4, max_num_batched_tokens=32,
                                           admission="none", enable_prefix_caching=True),
                       block_pool=pool, prefix_cache=cache)
    k = 0
    for wave in waves:
        want = fixtures.greedy(model, wave, 6)
        ids = []
        for p in wave:
            ids.append(engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{k}"))
            k += 1
        with forbid_calls(name, _prefix_cache_module(), enabled=not allow):
            drive(engine, f"{name} (serving shared prefixes from a 16-page pool)", max_steps=300)
        for rid, p, w in zip(ids, wave, want):
            got = engine.requests[rid].output_token_ids
            expect(got == w, f"{name}: serving a float64 model with prefix caching, request {rid} produced {got} "
                             f"instead of the model's greedy answer {w}: a lookup returned a page whose contents are "
                             "not this prompt's (unconfirmed hit, or a stale entry of an evicted page)")
    expect(cache.hit_tokens > 0, f"{name}: requests sharing a {len(shared)}-token prefix were served but the cache "
                                 "never hit (hit_tokens == 0): lookup must find the pages registered before")


@check("StudentPrefixCache", forbidden=_prefix_cache_class)
def check_StudentPrefixCache(impl, seed, allow_reference):
    name = "StudentPrefixCache"
    expect(isinstance(impl, type), f"{name} must be a class, got {type(impl).__name__}")
    rng = random.Random(seed)
    with forbid_calls(name, _prefix_cache_module(), enabled=not allow_reference):
        _unit(impl, rng)
        _collisions(impl, rng)
    _engine(impl, seed, allow_reference)
