"""The slot formula (slot = page * page_size + offset) is written once, in `kv/slots.py`: the KV
manager's page tables and the scheduler's output call it, so the slots the manager hands out and
the slots the runner writes K/V at cannot drift apart."""
import random
import sys

from course_lib.kv.page_table import PageTable
from course_lib.kv.slots import slot_mapping
from course_lib.scheduler.output import ScheduledRequest


def _callers_of_slot_mapping(fn):
    """Names of the functions that call `slot_mapping` while `fn()` runs."""
    callers = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is slot_mapping.__code__:
            callers.append(frame.f_back.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return callers


def test_page_table_and_scheduled_request_use_the_one_formula():
    table = PageTable(page_size=4)
    table.pages = (7, 2, 9)
    entry = ScheduledRequest("r", num_new_tokens=5, start=3, samples=True, page_ids=(7, 2, 9))
    assert _callers_of_slot_mapping(lambda: table.slots(3, 5)) == ["slots"]
    assert _callers_of_slot_mapping(lambda: table.slot(5)) == ["slot"]
    assert _callers_of_slot_mapping(lambda: entry.slots(4)) == ["slots"]


def test_every_slot_map_agrees_with_the_formula():
    rng = random.Random(0)
    for _ in range(200):
        page_size = rng.choice([1, 2, 3, 4, 16])
        pages = tuple(rng.sample(range(64), rng.randint(1, 6)))
        start = rng.randrange(len(pages) * page_size)
        count = rng.randint(0, len(pages) * page_size - start)
        want = [pages[p // page_size] * page_size + p % page_size for p in range(start, start + count)]
        table = PageTable(page_size)
        table.pages = pages
        entry = ScheduledRequest("r", count, start, samples=True, page_ids=pages)
        assert slot_mapping(pages, page_size, start, count) == table.slots(start, count) == entry.slots(page_size) == want
        assert [table.slot(p) for p in range(start, start + count)] == want
