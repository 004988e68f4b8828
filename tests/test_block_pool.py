import pytest

from course_lib.kv.block_pool import BlockPool, OutOfPages
from course_lib.kv.page_table import PageTable
from course_lib.kv.prefix_cache import PrefixCache


def test_allocate_and_free_return_pages_to_the_pool():
    pool = BlockPool(num_pages=4, page_size=8)
    pages = pool.allocate(3)
    assert len(set(pages)) == 3 and pool.num_free_pages == 1
    pool.free(pages)
    assert pool.num_free_pages == 4
    pool.check_invariants()


def test_out_of_pages_names_what_was_asked_and_what_is_left():
    pool = BlockPool(num_pages=2, page_size=4)
    pool.allocate(2)
    with pytest.raises(OutOfPages, match="asked for 1 pages but only 0 of 2"):
        pool.allocate(1)


def test_double_free_is_caught():
    pool = BlockPool(num_pages=2, page_size=4)
    (page,) = pool.allocate(1)
    pool.free([page])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([page])


def test_shared_page_is_free_only_after_its_last_owner_leaves():
    pool = BlockPool(num_pages=2, page_size=4)
    (page,) = pool.allocate(1)
    pool.share(page)
    assert pool.ref_counts[page] == 2
    pool.free([page])
    assert not pool.is_free(page)
    pool.free([page])
    assert pool.is_free(page)
    pool.check_invariants()


def test_page_table_maps_positions_to_slots_across_scattered_pages():
    table = PageTable(page_size=4)
    table.pages = [7, 2, 5]
    assert table.slot(0) == 28 and table.slot(3) == 31 and table.slot(4) == 8 and table.slot(9) == 21
    assert table.slots(3, 3) == [31, 8, 9]
    assert table.pages_needed(12) == 0 and table.pages_needed(13) == 1


def test_cached_pages_are_evicted_last_and_least_recently_freed_first():
    pool = BlockPool(num_pages=4, page_size=2)
    cache = PrefixCache(pool)
    a, b, c, d = pool.allocate(4)
    serial = cache.register(a, 0, (1, 2))
    cache.register(b, serial, (3, 4))
    pool.free([a, b])  # cached: back of the queue
    pool.free([c])  # blank: front of the queue
    (first,) = pool.allocate(1)
    assert first == c, "a blank page must be reused before any cached one"
    (second,) = pool.allocate(1)
    assert second == b and not cache.is_cached(b), "tail page freed first, so evicted first"
    assert cache.lookup([1, 2, 3, 4], 2)[0] == [a]
