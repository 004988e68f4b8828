"""Checks for notebook 03 (paged KV): the block pool, slot mapping, the flat batch, and the two kinds of
waste.

The pool is checked three ways: a scripted walk through the cases that matter (the last free
page, running out, double free, shared pages), a seeded random sequence of requests arriving,
growing, sharing and leaving (the full state is compared after every operation), and serving a
float64 model through the real engine with the student's pool (greedy tokens must not change).
The flat batch is judged field by field on hand-made steps (mixed decodes and prefill chunks, prefix-cache
hits, page boundaries inside a chunk, padding rows, scattered pages) and on every step of a float64 model
served through `LLMEngine(..., batch_builder=...)` (chunked prefill and prefix caching on, both forwards,
and a static batch with padding rows), whose greedy tokens must equal the dense model's.
"""
from __future__ import annotations

import random

from course_lib import EngineConfig, LLMEngine, SamplingParams

from .. import fixtures
from .._checking import (REFERENCE_MESSAGE, broke, call, check, describe_exception, drive, expect, expect_greedy_answers, expect_unchanged, fail, forbid_calls, is_tensor,
                         kind_of, plain_int, pristine, show, watch_calls)


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


# ---------------------------------------------------------------------------------------------
# slot_mapping
# ---------------------------------------------------------------------------------------------


def _page_table_module():
    import course_lib.kv.page_table as page_table
    import course_lib.kv.slots as slots

    return [page_table, slots]


def _slots(table, ps, start, count):
    return [table[p // ps] * ps + p % ps for p in range(start, start + count)]


@check("slot_mapping")
def check_slot_mapping(impl, seed, allow_reference):
    rng = random.Random(seed)
    cases = [([7, 2, 9], 4, 0, 12), ([7, 2, 9], 4, 5, 6), ([7, 2, 9], 4, 4, 1), ([7, 2, 9], 4, 3, 0), ([3], 1, 0, 1)]
    for _ in range(4):
        ps = rng.choice([1, 2, 3, 4, 8, 16])
        table = rng.sample(range(64), rng.randint(1, 6))
        capacity = len(table) * ps
        start = rng.randint(0, capacity - 1)
        cases.append((table, ps, start, rng.randint(1, capacity - start)))
    with forbid_calls("slot_mapping", _page_table_module(), enabled=not allow_reference):
        for table, ps, start, count in cases:
            shown = f"slot_mapping({table}, page_size={ps}, start={start}, count={count})"
            got = call(shown, impl, list(table), ps, start, count)
            want = _slots(table, ps, start, count)
            expect(type(got) in (list, tuple), lambda: f"{shown} must return a list of slots, got {kind_of(got)}",
                   rule="a list of ints")
            bad = next((i for i, x in enumerate(got) if plain_int(x) is None), None)
            expect(bad is None, lambda: f"{shown} must return a list of slots (ints), but item {bad} is "
                                        f"{kind_of(got[bad])} {show(got[bad])}", rule="a list of ints")
            got = [plain_int(x) for x in got]
            if got == want:
                continue
            message = f"{shown} = {got}, expected {want} (slot = page * page_size + position % page_size)."
            if got == list(range(start, start + count)):
                broke("any page order", message + " Those are token positions: map each through the block table "
                                                  "(page = table[pos // page_size]).")
            if len(got) != count:
                broke("the positions asked", message + f" It has {len(got)} slots instead of count={count}: "
                                                       "positions start .. start + count - 1.")
            if got == _slots(table, ps, 0, count):
                broke("the positions asked", message + " It starts at position 0: the positions are start .. "
                                                       "start + count - 1.")
            broke("slot layout", message)


# ---------------------------------------------------------------------------------------------
# waste
# ---------------------------------------------------------------------------------------------


def _waste_cases(rng, hi):
    cases = [[5, 8, 1], [16, 32, 0], [1]]
    for _ in range(3):
        cases.append([rng.randint(0 if hi else 1, 60) for _ in range(rng.randint(1, 8))])
    return cases


def _waste_module():
    import course_lib.kv.waste as waste

    return [waste]


@check("paged_waste")
def check_paged_waste(impl, seed, allow_reference):
    rng = random.Random(seed)
    for tokens in _waste_cases(rng, True):
        for ps in (4, 16, rng.choice([1, 3, 8])):
            shown = f"paged_waste({tokens}, page_size={ps})"
            with forbid_calls("paged_waste", _waste_module(), enabled=not allow_reference):
                got = call(shown, impl, list(tokens), ps)
            want = sum(-(-n // ps) * ps - n for n in tokens)
            expect(type(got) is int, lambda: f"{shown} must return an int (a number of slots), got {kind_of(got)} "
                                             f"{show(got)}", rule="an int")
            if got != want:
                message = (f"{shown} = {got}, expected {want}: each request holds ceil(n / page_size) pages; the "
                           "unused slots of its last page are the waste.")
                if got == sum(-(-n // ps) - n / ps for n in tokens) or got == sum(-(-n // ps) for n in tokens):
                    broke("slots, not pages", message + " Count slots, not pages.")
                hint = ""
                if got == sum((n // ps + 1) * ps - n for n in tokens):
                    hint = (" It reserves one page too many when a request fills its last page exactly: "
                            "pages = ceil(n / page_size) = -(-n // page_size).")
                elif got == sum(max(1, -(-n // ps)) * ps - n for n in tokens):
                    hint = " A request with 0 tokens holds no page yet."
                broke("whole pages", message + hint)


@check("contiguous_waste")
def check_contiguous_waste(impl, seed, allow_reference):
    rng = random.Random(seed)
    for tokens in _waste_cases(rng, False):
        tokens = [max(1, n) for n in tokens]
        for max_len in (max(tokens), 64, rng.choice([100, 128, 2048])):
            shown = f"contiguous_waste({tokens}, max_len={max_len})"
            with forbid_calls("contiguous_waste", _waste_module(), enabled=not allow_reference):
                got = call(shown, impl, list(tokens), max_len)
            want = sum(max_len - n for n in tokens)
            expect(type(got) is int, lambda: f"{shown} must return an int (a number of slots), got {kind_of(got)} "
                                             f"{show(got)}", rule="an int")
            if got != want:
                hint = ""
                if got == sum(max(tokens) - n for n in tokens) and max_len != max(tokens):
                    hint = " Each request reserves max_len slots, not the longest request's length."
                elif got == len(tokens) * max_len:
                    hint = " Subtract the slots each request actually fills."
                broke("max_len each", f"{shown} = {got}, expected {want}: every request reserves max_len slots up "
                                      "front; the "
                     f"ones it does not fill are the waste.{hint}")


# ---------------------------------------------------------------------------------------------
# build_flat_batch: one step's SchedulerOutput as the runner's tensors
# ---------------------------------------------------------------------------------------------

_LONG_FIELDS = ("token_ids", "positions", "slot_mapping")  # one entry per row, int64
_INT_FIELDS = ("block_tables", "seq_lens", "query_start_loc")  # per sequence, int32
_FIELDS = _LONG_FIELDS + _INT_FIELDS


def _flat_batch_function():
    from course_lib.runner_batch import build_flat_batch

    return (build_flat_batch,)


def _flat_batch_modules():
    """What the student's builder may not run: course_lib's builder and its slot maps, the request's
    `slots()` among them (reading the ScheduledRequest's fields is fine: the rest of its module is not
    watched)."""
    import course_lib.kv.page_table as page_table
    import course_lib.kv.slots as slots
    import course_lib.runner_batch as runner_batch
    from course_lib.scheduler.output import ScheduledRequest

    return [runner_batch, slots, page_table, ScheduledRequest.slots]


def _entry(rid, start, n, page_ids, rng=None, tokens=None, vocab=61):
    from course_lib.scheduler.output import ScheduledRequest

    if tokens is None:
        tokens = [rng.randrange(3, vocab) if rng else (7 * (start + i) + 5 * len(page_ids)) % 50 + 3 for i in range(n)]
    return ScheduledRequest(rid, n, start, samples=True, token_ids=tokens, page_ids=tuple(page_ids),
                            sampling_params=SamplingParams(max_tokens=4))


def _output(entries, pad=0):
    from course_lib.scheduler.output import SchedulerOutput

    # The runner hands the builder its entries with the single-token ones first.
    entries = sorted(entries, key=lambda s: s.num_new_tokens > 1)
    return SchedulerOutput(scheduled=entries, num_padded_tokens=pad, num_running=len(entries))


def _describe(out, page_size, pad_slot) -> str:
    parts = [f"{out.num_padded_tokens} padding row(s)"] if out.num_padded_tokens else []
    for s in out.scheduled:
        where = (f"position {s.start}" if s.num_new_tokens == 1 else
                 f"positions {s.start}..{s.start + s.num_new_tokens - 1}")
        parts.append(f"{s.request_id}: {s.num_new_tokens} new token(s) {s.token_ids} at {where}, page_ids {s.page_ids}")
    return f"page_size={page_size}, pad_slot={pad_slot}, rows in order: " + "; ".join(parts)


def _expected_batch(out, page_size, pad_slot) -> dict:
    """What every field must hold, as nested lists (the check's own oracle)."""
    pad = out.num_padded_tokens
    want = {"token_ids": [0] * pad, "positions": [0] * pad, "slot_mapping": [pad_slot] * pad,
            "block_tables": [[pad_slot // page_size] for _ in range(pad)], "seq_lens": [1] * pad,
            "query_start_loc": list(range(pad + 1))}
    for s in out.scheduled:
        want["token_ids"] += s.token_ids
        want["positions"] += list(s.positions)
        want["slot_mapping"] += _slots(s.page_ids, page_size, s.start, s.num_new_tokens)
        want["block_tables"].append(list(s.page_ids))
        want["seq_lens"].append(s.start + s.num_new_tokens)
        want["query_start_loc"].append(want["query_start_loc"][-1] + s.num_new_tokens)
    width = max(len(t) for t in want["block_tables"])
    want["block_tables"] = [t + [0] * (width - len(t)) for t in want["block_tables"]]
    return want


def _hint(field, got, want, out, page_size, pad_slot) -> str:
    """A pointer to the likely mistake, for the patterns students really produce."""
    pad, entries = out.num_padded_tokens, out.scheduled
    news = [1] * pad + [s.num_new_tokens for s in entries]
    starts = [0] * pad + [s.start for s in entries]
    if field == "positions":
        if got == [p + 1 for p in want]:
            return " Off by one: an entry's first new token sits at position `start`."
        if got == [0] * pad + [i for s in entries for i in range(s.num_new_tokens)]:
            return (" Each entry's tokens start at position `start`, not 0: the tokens before it are already in "
                    "the cache (an earlier chunk, or a prefix-cache hit).")
    if field == "slot_mapping":
        if got[pad:] == _positions(out)[pad:]:
            return (" Those are token positions: a slot is where the position lives in the pool, through the "
                    "entry's page_ids (your slot_mapping of section 2).")
        if got[:pad] != want[:pad]:
            return f" The padding rows write to pad_slot ({pad_slot}): any other slot may belong to a request."
    if field == "seq_lens":
        if got == news:
            return (" seq_lens counts every token the sequence attends to: the ones already in the cache (`start`) "
                    "plus its new ones, not only the new ones.")
        if got == starts:
            return " A new token attends to itself too: seq_lens is start + num_new_tokens."
    if field == "query_start_loc":
        if len(got) == len(want) - 1:
            return (" It needs one offset more than there are sequences: 0 first, then where each sequence's rows "
                    "end (the last one is the number of rows).")
    if field == "block_tables" and pad and len(got) == len(want) - pad:
        return " Each padding row is a sequence of its own (one token that reads only itself)."
    if field in ("token_ids", "positions", "slot_mapping") and sorted(map(str, got)) == sorted(map(str, want)):
        return (" The right rows in the wrong order: padding rows first, then the entries in the order of "
                "output.scheduled (the runner reads each sampled token from its entry's last row).")
    return ""


def _positions(out) -> list[int]:
    return [0] * out.num_padded_tokens + [p for s in out.scheduled for p in s.positions]


def _broke_flat(rule, message):
    """broke() with each rule spelled out (tests/test_rules_blocks.py reads the names from the source)."""
    {"row order": lambda: broke("row order", message),
     "positions and slots": lambda: broke("positions and slots", message),
     "padding rows": lambda: broke("padding rows", message),
     "one sequence each": lambda: broke("one sequence each", message),
     }.get(rule, lambda: broke("tensor contract", message))()


def _field_rule(field, hint: str) -> str:
    """The rule of the notebook's block that a wrong value of `field` breaks."""
    if "in the wrong order" in hint:
        return "row order"
    if "padding row" in hint or "pad_slot" in hint:
        return "padding rows"
    return "positions and slots" if field in _LONG_FIELDS else "one sequence each"


def _tensor_problem(field, t, want, rows, seqs, pad, device="cpu") -> tuple[str, str] | None:
    """(rule, problem) when `t` breaks the tensor contract or has the wrong shape, else None."""
    import torch

    if not is_tensor(t):
        return "tensor contract", f"{field} must be a torch.Tensor, got {kind_of(t)}"
    if t.device.type != torch.device(device).type:
        return "tensor contract", (f"{field} is on {t.device}, expected the device argument {device!r}: build "
                                   "each tensor on `device` (the engine passes the one its model runs on)")
    dtype = torch.long if field in _LONG_FIELDS else torch.int32
    if t.dtype != dtype:
        return "tensor contract", (f"{field} is {t.dtype}, expected {dtype} (token ids, positions and slots are int64; block tables, "
                "sequence lengths and offsets int32: the attention kernels and the cpu forward read them as such)")
    shape = [len(want), len(want[0])] if field == "block_tables" else [len(want)]
    if list(t.shape) != shape:
        what = {"token_ids": f"one per row: {rows} rows", "positions": f"one per row: {rows} rows",
                "slot_mapping": f"one per row: {rows} rows", "seq_lens": f"one per sequence: {seqs} sequences",
                "query_start_loc": f"one more than the {seqs} sequences",
                "block_tables": f"one row per sequence ({seqs}), as wide as the longest page table ({shape[-1]})"}
        hint = ""
        if field == "query_start_loc" and list(t.shape) == [seqs]:
            hint = (" It needs one offset more than there are sequences: 0 first, then where each sequence's rows "
                    "end (the last one is the number of rows).")
        elif field in _INT_FIELDS and pad and t.dim() >= 1 and t.shape[0] in (seqs - pad, seqs - pad + 1):
            hint = " Each padding row is a sequence of its own (one token that reads only itself)."
        rule = "padding rows" if "padding row" in hint else _field_rule(field, hint)
        return rule, f"{field} has shape {list(t.shape)}, expected {shape} ({what[field]}).{hint}"
    if not t.is_contiguous():
        return "tensor contract", (f"{field} is not contiguous (strides {t.stride()}): the cpu forward reads its memory directly; "
                "build it contiguous (or call .contiguous())")
    return None


def _judge_batch(got, out, want, page_size, pad_slot, where: str) -> None:
    """Fail unless `got` is exactly `want`, the flat batch of `out` (the check's own, never handed over)."""
    shown = f"build_flat_batch{where} for the step ({_describe(out, page_size, pad_slot)})"
    missing = [f for f in _FIELDS if not hasattr(got, f)]
    expect(not missing, lambda: f"{shown} returned {kind_of(got)} without {', '.join(missing)}: return a "
                                "FlatBatch (from course_lib.runner_batch import FlatBatch)", rule="tensor contract")
    rows, seqs = len(want["token_ids"]), len(want["seq_lens"])
    for field in _FIELDS:
        t = getattr(got, field)
        problem = _tensor_problem(field, t, want[field], rows, seqs, out.num_padded_tokens)
        if problem:
            _broke_flat(problem[0], f"{shown}: {problem[1]}")
        values = t.tolist()
        if values != want[field]:
            hint = _hint(field, values, want[field], out, page_size, pad_slot)
            _broke_flat(_field_rule(field, hint), f"{shown}: {field} = {values}, expected {want[field]}.{hint}")


def _call_builder(impl, shown, given, page_size, device, pad_slot, allow_reference):
    """The student's builder called on `given`; calls into course_lib's builder or slot maps are refused."""
    if allow_reference:
        return call(shown, impl, given, page_size, device, pad_slot)
    hits = []
    try:
        with watch_calls(_flat_batch_modules()) as hits:
            return call(shown, impl, given, page_size, device, pad_slot)
    finally:  # read once the watch has closed: on the grader's replay that is when the record fills it in
        used = [f"{m}.{f}" for m, f in hits]
        if used:
            fail(f"build_flat_batch {REFERENCE_MESSAGE} (it calls {used[0]}): compute the rows yourself "
                 "(your slot_mapping of section 2 gives the slots)")


def _build(impl, out, page_size, device, pad_slot, where, allow_reference):
    """The student's batch of `out`, judged: the expected batch is computed from `out` first, and the
    student's code is handed a copy of it (`out` may be the engine's own, which the runner reads next)."""
    want = _expected_batch(out, page_size, pad_slot)
    shown = f"build_flat_batch{where} ({_describe(out, page_size, pad_slot)})"
    given = pristine(out)
    got = _call_builder(impl, shown, given, page_size, device, pad_slot, allow_reference)
    expect_unchanged(shown, "output", given, out)
    _judge_batch(got, out, want, page_size, pad_slot, where)
    return got


def _fixed_outputs():
    """(output, page_size, pad_slot): the cases that matter, written out."""
    e = _entry
    return [
        # the notebook's worked example: two decodes, a prefill chunk crossing a page boundary (8)
        (_output([e("r0", 9, 1, [7, 3, 5], tokens=[18]), e("r1", 4, 1, [2, 8], tokens=[33]),
                  e("r2", 6, 5, [0, 6, 9], tokens=[12, 40, 7, 7, 21])]), 4, 40),
        # a static batch's decode step: padding rows (finished passengers) first
        (_output([e("r0", 5, 1, [3, 1]), e("r1", 2, 1, [6])], pad=2), 4, 48),
        # a prefix-cache hit (the chunk starts at 8) beside a fresh prompt; no decode
        (_output([e("r0", 8, 3, [5, 1, 11]), e("r1", 0, 7, [3, 10])]), 4, 48),
        # page size 1, and a lone prompt in pages of 16
        (_output([e("r0", 3, 1, [4, 0, 9, 2]), e("r1", 1, 3, [7, 5, 8, 1])]), 1, 10),
        (_output([e("r0", 0, 20, [2, 0])]), 16, 48),
    ]


def _random_output(rng):
    page_size = rng.choice([2, 4, 8])
    n_decodes = rng.randint(0, 3)
    n_chunks = rng.randint(0 if n_decodes else 1, 3)
    shapes = []
    for i in range(n_decodes + n_chunks):
        n = 1 if i < n_decodes else rng.randint(2, 3 * page_size)
        start = rng.choice([0, page_size * rng.randint(1, 3), rng.randint(1, 4 * page_size)])
        shapes.append((start, n, -(-(start + n) // page_size)))
    num_pages = sum(need for _, _, need in shapes) + rng.randint(0, 6)
    free = rng.sample(range(num_pages), num_pages)  # scattered page ids
    entries = [_entry(f"r{i}", start, n, [free.pop() for _ in range(need)], rng)
               for i, (start, n, need) in enumerate(shapes)]
    pad = rng.choice([0, 0, 1, 3]) if n_chunks == 0 else 0
    return _output(entries, pad), page_size, num_pages * page_size  # the scratch page after the pool


def _serve_through_builder(impl, seed, allow_reference, config, label):
    """A float64 model served with the student's builder; each batch is judged, then the tokens."""
    rng = random.Random(300 + seed)
    model = fixtures.random_model(seed)
    vocab = model.config.vocab_size
    systems = [[rng.randrange(3, vocab) for _ in range(rng.choice([8, 9, 11]))] for _ in range(2)]
    prompts = [systems[i % 2] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for i in range(6)]
    want = fixtures.greedy(model, prompts, 6)
    calls = [0]

    def builder(out, page_size, device, pad_slot):
        calls[0] += 1
        where = f" (engine step {calls[0]}, {label})"
        return _build(impl, out, page_size, device, pad_slot, where, allow_reference)

    engine = LLMEngine(model, config, batch_builder=builder)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"build_flat_batch ({label})", max_steps=300)
    expect(calls[0] > 0, f"build_flat_batch ({label}): the engine never called the builder")
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"build_flat_batch ({label}): request r{i} (prompt {prompts[i]}) produced {got} instead of the model's "
        f"greedy answer {w}"))
    return engine


@check("build_flat_batch", forbidden=_flat_batch_function)
def check_build_flat_batch(impl, seed, allow_reference):
    expect(callable(impl), f"build_flat_batch must be a function, got {type(impl).__name__}")
    rng = random.Random(seed)
    cases = _fixed_outputs() + [_random_output(rng) for _ in range(8)]
    for out, page_size, pad_slot in cases:
        _build(impl, out, page_size, "cpu", pad_slot, "", allow_reference)
    # "auto" is the C forward where it can run here, else the PyTorch one: either way the steps (and so the
    # questions this check asks) are the same, which a recorded grading replayed elsewhere relies on.
    for forward in ("eager", "auto"):
        config = EngineConfig(page_size=4, num_pages=20, max_num_seqs=4, max_num_batched_tokens=10, admission="none",
                              enable_chunked_prefill=True, enable_prefix_caching=True, forward=forward)
        engine = _serve_through_builder(impl, seed, allow_reference, config,
                                        f"chunked prefill and prefix caching, forward={forward!r}")
        expect(engine.prefix_cache.hit_tokens > 0, "internal: the prefix-caching run never hit the cache")
    static = EngineConfig(page_size=4, num_pages=40, max_num_seqs=4, scheduler="static", admission="none",
                          forward="auto")
    engine = _serve_through_builder(impl, seed, allow_reference, static, "static batching (padding rows)")
    expect(sum(s.num_padded_tokens for s in engine.step_stats) > 0, "internal: the static run had no padding row")
