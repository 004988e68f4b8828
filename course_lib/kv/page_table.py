"""One request's page table: logical token position -> physical slot in the pool.

`pages` is a tuple, replaced (never changed in place) when the request grows: a step's
SchedulerOutput can then carry it as it is, and it stays what it was in that step."""
from __future__ import annotations


class PageTable:
    __slots__ = ("pages", "page_size")

    def __init__(self, page_size: int):
        self.pages: tuple[int, ...] = ()
        self.page_size = page_size

    @property
    def num_slots(self) -> int:
        return len(self.pages) * self.page_size

    def pages_needed(self, num_tokens: int) -> int:
        """More pages this table needs so that it can hold `num_tokens` tokens."""
        return max(0, -(-num_tokens // self.page_size) - len(self.pages))

    def slot(self, position: int) -> int:
        page = self.pages[position // self.page_size]
        return page * self.page_size + position % self.page_size

    def slots(self, start: int, count: int) -> list[int]:
        ps, pages = self.page_size, self.pages
        return [pages[p // ps] * ps + p % ps for p in range(start, start + count)]
