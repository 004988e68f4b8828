"""One request's page table: logical token position -> physical slot in the pool.

`pages` is a tuple, replaced (never changed in place) when the request grows: a step's
SchedulerOutput can then carry it as it is, and it stays what it was in that step."""
from __future__ import annotations

from .slots import slot_mapping


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
        return slot_mapping(self.pages, self.page_size, position, 1)[0]

    def slots(self, start: int, count: int) -> list[int]:
        return slot_mapping(self.pages, self.page_size, start, count)
