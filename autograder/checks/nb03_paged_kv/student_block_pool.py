"""Notebook 03, `StudentBlockPool`: a scripted walk, a seeded random walk (the full state compared
after every operation) and a float64 model served through the student's pool."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import (broke, call, check, describe_exception, drive, expect, expect_greedy_answers,
                                  forbid_calls)
from course_lib import EngineConfig, LLMEngine, SamplingParams


def _block_pool_class():
    from course_lib.kv.block_pool import BlockPool

    return (BlockPool,)


def _block_pool_module():
    import course_lib.kv.block_pool as block_pool

    return [block_pool]


def _is_out_of_pages(exc) -> bool:
    from course_lib.kv.block_pool import OutOfPages

    return isinstance(exc, OutOfPages) or type(exc).__name__ == "OutOfPages"


class _PoolModel:
    """What the pool's state must be: owners per page."""

    def __init__(self, impl, num_pages, page_size):
        self.pool = call(f"StudentBlockPool({num_pages}, {page_size})", impl, num_pages, page_size)
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        self.log: list[str] = []

    @property
    def free_pages(self):
        return [p for p, r in enumerate(self.refs) if r == 0]

    def state_error(self) -> str | None:
        pool = self.pool
        n_free = call("num_free_pages", lambda: pool.num_free_pages)
        if n_free != len(self.free_pages):
            return f"num_free_pages is {n_free}, expected {len(self.free_pages)}"
        for page in range(self.num_pages):
            rc = call(f"ref_counts[{page}]", lambda: pool.ref_counts[page])
            if rc != self.refs[page]:
                return f"ref_counts[{page}] is {rc}, expected {self.refs[page]}"
            free = call(f"is_free({page})", pool.is_free, page)
            if bool(free) != (self.refs[page] == 0):
                return (f"page {page} is still marked used (is_free({page}) is False) although nobody holds it"
                        if self.refs[page] == 0 else
                        f"page {page} is marked free (is_free({page}) is True) but {self.refs[page]} owner(s) still hold it")
        return None

    def verify(self, action: str, sharing: bool = False) -> None:
        self.log.append(action)
        error = self.state_error()
        if error:
            message = (f"StudentBlockPool({self.num_pages} pages): after {action}, {error}. (Last operations: "
                       f"{'; '.join(self.log[-4:])})")
            if sharing:
                broke("shared until last owner", message)
            broke("the books", message)

    def allocate(self, n, action):
        free_before = set(self.free_pages)
        try:
            pages = self.pool.allocate(n)
        except (NotImplementedError, AssertionError):
            raise
        except Exception as exc:  # noqa: BLE001 - the student's code refused pages it has
            broke("distinct free pages", f"StudentBlockPool: {action}: allocate({n}) with {len(free_before)} free "
                                         f"pages raised {describe_exception(exc)}: it must hand them out")
        expect(isinstance(pages, (list, tuple)), f"StudentBlockPool.allocate({n}) must return a list of page ids, "
                                                 f"got {type(pages).__name__}", rule="distinct free pages")
        pages = list(pages)
        expect(len(pages) == n, f"StudentBlockPool.allocate({n}) returned {len(pages)} pages: {pages}", rule="distinct free pages")
        expect(len(set(pages)) == n, f"StudentBlockPool.allocate({n}) returned the same page twice: {pages}", rule="distinct free pages")
        for p in pages:
            expect(isinstance(p, int) and 0 <= p < self.num_pages,
                   f"StudentBlockPool.allocate({n}) returned {p!r}, not a page id in 0..{self.num_pages - 1}",
                   rule="distinct free pages")
            if p not in free_before:
                broke("distinct free pages", f"StudentBlockPool: {action}: allocate({n}) handed out page {p}, which "
                      "is still in use "
                     f"({self.refs[p]} owner(s)): a page in use must never be allocated again (check free() and "
                     "share() keep the free list right)")
        for p in pages:
            self.refs[p] = 1
        self.verify(f"{action} (allocate({n}) -> {pages})")
        return pages

    def free(self, pages, action):
        call(f"free({pages})", self.pool.free, list(pages))
        for p in pages:
            self.refs[p] -= 1
        self.verify(f"{action} (free({pages}))")

    def share(self, page, action):
        call(f"share({page})", self.pool.share, page)
        self.refs[page] += 1
        self.verify(f"{action} (share({page}))", sharing=True)

    def expect_out_of_pages(self, n, action):
        before = len(self.free_pages)
        try:
            self.pool.allocate(n)
        except Exception as exc:  # noqa: BLE001
            expect(_is_out_of_pages(exc),
                   f"StudentBlockPool: allocate({n}) with only {before} free pages must raise OutOfPages "
                   f"(from course_lib.kv.block_pool import OutOfPages), got {type(exc).__name__}: {exc}",
                   rule="all or nothing")
        else:
            broke("all or nothing", f"StudentBlockPool: allocate({n}) with only {before} free pages must raise "
                                    "OutOfPages, but it returned")
        error = self.state_error()
        if error:
            broke("all or nothing", f"StudentBlockPool: after allocate({n}) failed with only {before} free pages, the pool must be "
                 f"unchanged (check before taking any page), but {error}")
        self.log.append(f"{action} (allocate({n}) -> OutOfPages)")


def _expect_rejected_free(m, pages, what):
    """free(pages) must raise (some page in it has fewer owners than the list frees) and change nothing."""
    before = list(m.refs)
    try:
        m.pool.free(list(pages))
    except Exception:  # noqa: BLE001 - any error is fine: a double free must not pass silently
        pass
    else:
        broke("double free raises", f"StudentBlockPool: {what}: free must raise an error (a double free); silently "
                                    "accepting it corrupts the free list")
    error = m.state_error()
    if error:
        if len(pages) > 1:
            broke("all or nothing", f"StudentBlockPool: {what}: free raised, but the books changed: {error}. Check "
                                    "every page of the list (counting repeats) before changing anything")
        broke("double free raises", f"StudentBlockPool: after the rejected {what}, {error}")
    m.refs = before
    m.log.append(f"{what} (rejected)")


_MISSING = object()


HOOKS_OFF = "self.on_evict = None and self.is_cached = lambda page: False"


def _expect_hooks_off(pool, num_pages=8):
    """Both prefix-cache hooks start off. One message names both defaults, whichever of them is wrong:
    a student who fixes the one named should not meet the other on the next run."""
    wrong = []
    on_evict = getattr(pool, "on_evict", _MISSING)
    if on_evict is _MISSING:
        wrong.append("it has no attribute on_evict")
    elif on_evict is not None:
        wrong.append("its on_evict is not None")
    is_cached = getattr(pool, "is_cached", _MISSING)
    if is_cached is _MISSING:
        wrong.append("it has no attribute is_cached")
    elif not callable(is_cached):
        wrong.append("its is_cached is not callable")
    else:
        for page in range(num_pages):
            try:
                cached = is_cached(page)
            except (NotImplementedError, AssertionError):
                raise
            except Exception as exc:  # noqa: BLE001 - anything the student's code raises
                wrong.append(f"its is_cached({page}) raised {describe_exception(exc)}")
                break
            if cached:
                wrong.append(f"its is_cached({page}) is true on a new pool")
                break
    expect(not wrong, lambda: f"a new StudentBlockPool({num_pages}, 4) must start with both prefix-cache hooks off: "
                              f"{HOOKS_OFF} (notebook 6's cache replaces both), but " + " and ".join(wrong),
           rule="hooks start off")


def _walkthrough(impl):
    m = _PoolModel(impl, 8, 4)
    pool = m.pool
    expect(getattr(pool, "num_pages", None) == 8 and getattr(pool, "page_size", None) == 4,
           "StudentBlockPool(8, 4) must store num_pages=8 and page_size=4 as attributes (the engine reads them)",
           rule="the books")
    _expect_hooks_off(pool)
    m.verify("StudentBlockPool(8, 4)")
    a = m.allocate(3, "request A arrives")
    b = m.allocate(5, "request B takes the last 5 free pages")
    m.expect_out_of_pages(1, "request C finds the pool full")
    m.free(a, "request A finishes")
    m.expect_out_of_pages(4, "request C asks for 4 pages")
    _expect_rejected_free(m, [a[0]], f"freeing page {a[0]} a second time (request A already freed it)")
    # All or nothing: the double free is found half-way through the list (first or last), after pages
    # the call could legally free; the books must still be as they were.
    _expect_rejected_free(m, [b[0], a[0]], f"free([{b[0]}, {a[0]}]): page {b[0]} is held by request B, page {a[0]} "
                                           "is already free (found half-way through the list)")
    _expect_rejected_free(m, [a[0], b[1]], f"free([{a[0]}, {b[1]}]): page {a[0]} is already free, page {b[1]} is "
                                           "held by request B")
    # Duplicates in one call: page b[2] has one owner, the list frees it twice.
    _expect_rejected_free(m, [b[2], b[2]], f"free([{b[2]}, {b[2]}]): page {b[2]} has one owner but is listed twice")
    # Sharing: a page used by B gains an owner; it stays used until both have freed it.
    shared = b[0]
    m.share(shared, f"request D shares B's page {shared}")
    m.free([shared], f"request B frees page {shared} (D still uses it)")
    m.free([shared], f"request D frees page {shared}")
    # A free page with cached contents comes back into use through share(): it must leave the free list.
    revived = m.free_pages[0]
    m.share(revived, f"request E revives the free cached page {revived}")
    rest = m.allocate(len(m.free_pages), "request F takes every other free page")
    expect(revived not in rest, f"StudentBlockPool: page {revived} was revived by share() but allocate() handed it out "
                                "again", rule="shared until last owner")
    m.free(rest, "request F finishes")
    m.free([revived], "request E finishes")
    m.free(b[1:], "request B finishes")
    expect(pool.num_free_pages == 8, f"StudentBlockPool: after every request finished, num_free_pages is "
                                     f"{pool.num_free_pages}, expected 8", rule="the books")


def _random_walk(impl, seed):
    rng = random.Random(seed)
    m = _PoolModel(impl, rng.randint(10, 16), rng.choice([2, 4, 16]))
    held: dict[str, list[int]] = {}
    counter = 0
    for _ in range(60):
        op = rng.random()
        if op < 0.35 or not held:
            n = rng.randint(1, 4)
            counter += 1
            name = f"request {counter}"
            if n > len(m.free_pages):
                m.expect_out_of_pages(n, f"{name} arrives")
            else:
                held[name] = m.allocate(n, f"{name} arrives")
        elif op < 0.55:
            name = rng.choice(sorted(held))
            if m.free_pages:
                held[name] += m.allocate(1, f"{name} grows by one page")
        elif op < 0.7:
            donor = rng.choice(sorted(held))
            counter += 1
            name = f"request {counter}"
            prefix = held[donor][: rng.randint(1, len(held[donor]))]
            for p in prefix:
                m.share(p, f"{name} shares {donor}'s page {p}")
            held[name] = list(prefix)
        else:
            name = rng.choice(sorted(held))
            m.free(held.pop(name), f"{name} finishes and frees its pages")
    for name in sorted(held):
        m.free(held.pop(name), f"{name} finishes and frees its pages")


def _hooks_walkthrough(impl):
    """The prefix cache's two hooks switched on: a page whose contents are cached is evicted (on_evict)
    exactly when allocate hands it out again, and only then."""
    m = _PoolModel(impl, 6, 4)
    pool = m.pool
    cached: set[int] = set()
    evicted: list[int] = []

    def on_evict(page):
        expect(page in cached, f"StudentBlockPool: on_evict({page}) was called but is_cached({page}) is False: "
                               "expected on_evict only for pages whose contents are cached", rule="evict only on reuse")
        cached.discard(page)
        evicted.append(page)

    pool.is_cached = lambda page: page in cached
    pool.on_evict = on_evict
    first = m.allocate(6, "request A takes all 6 pages (none cached)")
    expect(not evicted, f"StudentBlockPool: allocate(6) on a pool with nothing cached called on_evict for {evicted}: "
                        "expected no call (is_cached was False for every page)", rule="evict only on reuse")
    prefix = first[:3]
    cached.update(prefix)
    m.free(first, f"request A finishes; its pages {prefix} stay cached")
    expect(not evicted, f"StudentBlockPool: free({first}) called on_evict for {evicted}: a cached page keeps its "
                        "contents when its last owner frees it (a later prompt may hit it); expected no eviction "
                        "until allocate hands the page out again", rule="evict only on reuse")
    expect(all(pool.is_free(p) for p in prefix),
           f"StudentBlockPool: cached pages {prefix} were freed (nobody holds them) but is_free says otherwise: a "
           "cached page nobody holds is free (it may be reused, or revived by share)", rule="evict only on reuse")
    revived = prefix[0]
    m.share(revived, f"request B's prompt hits the cached page {revived}")
    expect(not evicted, f"StudentBlockPool: share({revived}) of a cached page called on_evict({evicted[0] if evicted else ''}): "
                        "reviving a cached page keeps its contents, expected no eviction", rule="evict only on reuse")
    taken = m.allocate(5, "request C takes the 5 other pages")
    want = sorted(p for p in taken if p in prefix)
    expect(sorted(evicted) == want,
           f"StudentBlockPool: allocate(5) handed out {taken}, of which the cached pages are {want}, but on_evict was "
           f"called for {sorted(evicted)}: expected on_evict(page) once for each cached page handed out, before it "
           "is reused (its old contents are about to be overwritten)", rule="evict only on reuse")
    m.free(taken, "request C finishes")
    m.free([revived], "request B finishes")


def _serve_with_prefix_cache(impl, seed, name):
    """Serve a float64 model with prefix caching on through the student's pool: a pool small enough that
    cached pages are evicted and reused. Stale cache entries would give some request the wrong K/V."""
    rng = random.Random(100 + seed)
    model = fixtures.random_model(seed)
    vocab = model.config.vocab_size
    systems = [[rng.randrange(3, vocab) for _ in range(8)] for _ in range(3)]
    prompts = [systems[i // 4] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 5))] for i in range(12)]
    want = fixtures.greedy(model, prompts, 6)
    pool = impl(12, 4)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=12, max_num_seqs=2, max_num_batched_tokens=32,
                                           admission="none", enable_prefix_caching=True), block_pool=pool)
    evictions = []
    hook = pool.on_evict
    expect(callable(hook), f"{name}: with prefix caching on, the engine sets pool.on_evict, but it is {hook!r}", rule="evict only on reuse")
    pool.on_evict = lambda page: (evictions.append(page), hook(page))
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"{name} (prefix caching on, a 12-page pool, 12 prompts sharing 3 system prompts)", max_steps=400)
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name} with prefix caching on: request r{i} (prompt {prompts[i]}) produced {got} instead of the model's "
        f"greedy answer {w}: a page reused by allocate still looked cached (call self.on_evict(page) when handing "
        "out a page for which self.is_cached(page) is True), or a shared page was handed out while in use"),
        rule="evict only on reuse")
    hits = engine.prefix_cache.hit_tokens
    expect(hits > 0, f"{name} with prefix caching on: expected some prompt tokens served from the cache (12 prompts, "
                     f"3 system prompts), got {hits}: free pages must keep their contents until they are reused", rule="evict only on reuse")
    expect(pool.num_free_pages == 12, f"{name}: after every request finished {12 - pool.num_free_pages} of 12 pages are "
                                      "still held (cached pages nobody uses count as free)", rule="the books")
    expect(evictions, f"{name} with prefix caching on: 12 requests went through a 12-page pool, so cached pages had "
                      "to be reused, yet on_evict was never called: expected self.on_evict(page) whenever allocate "
                      "hands out a page for which self.is_cached(page) is True", rule="evict only on reuse")
    return evictions


@check("StudentBlockPool", forbidden=_block_pool_class)
def check_StudentBlockPool(impl, seed, allow_reference):
    name = "StudentBlockPool"
    expect(isinstance(impl, type), f"{name} must be a class, got {type(impl).__name__}")
    with forbid_calls(name, _block_pool_module(), enabled=not allow_reference):
        _walkthrough(impl)
        _hooks_walkthrough(impl)
        _random_walk(impl, seed)
        _serve_with_prefix_cache(impl, seed, name)
        # Serve a float64 model with the student's pool: small enough that requests get preempted.
        rng = random.Random(seed)
        model = fixtures.random_model(seed)
        prompts = fixtures.random_prompts(rng, 6, model.config.vocab_size, lo=1, hi=16)
        want = fixtures.greedy(model, prompts, 8)
        pool = impl(12, 4)
        engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=12, max_num_seqs=4, max_num_batched_tokens=16,
                                               admission="none"), block_pool=pool)
        for i, p in enumerate(prompts):
            engine.add_request(p, SamplingParams(max_tokens=8), request_id=f"r{i}")
        drive(engine, f"{name} (serving a float64 model from a 12-page pool)", max_steps=400)
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name}: serving a float64 model with your pool, request r{i} produced {got} instead of the model's greedy "
        f"answer {w}: two requests were given the same page, so one overwrote the other's keys and values"),
        rule="distinct free pages")
    expect(pool.num_free_pages == 12, f"{name}: after the engine finished every request, {12 - pool.num_free_pages} "
                                      "of 12 pages are still used: freed pages must return to the free list",
           rule="the books")
