"""What several of notebook 03's checks use: the slot formula, and the waste exercises' cases."""
from __future__ import annotations


def _slots(table, ps, start, count):
    return [table[p // ps] * ps + p % ps for p in range(start, start + count)]


def _waste_cases(rng, hi):
    cases = [[5, 8, 1], [16, 32, 0], [1]]
    for _ in range(3):
        cases.append([rng.randint(0 if hi else 1, 60) for _ in range(rng.randint(1, 8))])
    return cases


def _waste_module():
    import course_lib.kv.waste as waste

    return [waste]
