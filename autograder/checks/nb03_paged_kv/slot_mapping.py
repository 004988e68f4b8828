"""Notebook 03, `slot_mapping`: the slot of every token through the block table."""
from __future__ import annotations

import random

from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, plain_int, show

from ._shared import _slots


def _page_table_module():
    import course_lib.kv.page_table as page_table
    import course_lib.kv.slots as slots

    return [page_table, slots]


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
