"""The one module that reads (and, for the dashboard's controls, switches) engine internals.

Everything else in `course_lib.serve` uses LLMEngine's public API only (`add_request`, `step`,
`abort`, `has_unfinished_requests`, `stats()`, `pool.num_free_pages` / `pool.num_pages`). What the
dashboard shows needs more: who sits in which seat, who waits, which request owns each page,
which pages are shared through the prefix cache. When the engine's insides change, this file is
the one to adapt.

Every function here runs on the engine loop's thread, between steps, so nothing moves under it.
"""
from __future__ import annotations

from course_lib.scheduler.admission import make_admission

ADMISSION_POLICIES = ("none", "reserve", "watermark")


# ------------------------------------------------------------------------------------ queues
def running_requests(engine) -> list:
    return list(engine.scheduler.running)


def waiting_ids(engine, limit: int | None = None) -> list[str]:
    waiting = engine.scheduler.waiting
    ids = [r.request_id for r in waiting] if limit is None else [r.request_id for _, r in zip(range(limit), waiting)]
    return ids


def is_prefilling(request) -> bool:
    """Still computing its prompt (or recomputing it after a preemption)."""
    return request.num_computed_tokens < request.num_prompt_tokens


class SeatMap:
    """Stable seat numbers for the turnstile: a request keeps its seat until it leaves the batch
    (the scheduler's running list shifts when someone leaves, a seat must not)."""

    def __init__(self, num_seats: int):
        self.num_seats = num_seats
        self.seat_of: dict[str, int] = {}

    def update(self, engine) -> list:
        """One turnstile column: per seat, None or [request id, "prefill"/"decode"]."""
        running = running_requests(engine)
        present = {r.request_id for r in running}
        for rid in [rid for rid in self.seat_of if rid not in present]:
            del self.seat_of[rid]
        taken = set(self.seat_of.values())
        free = (s for s in range(self.num_seats) if s not in taken)
        column: list = [None] * self.num_seats
        for r in running:
            seat = self.seat_of.get(r.request_id)
            if seat is None:
                seat = self.seat_of[r.request_id] = next(free, None)
                if seat is None:  # more running than seats (static bus finishing): show who fits
                    del self.seat_of[r.request_id]
                    continue
            column[seat] = [r.request_id, "prefill" if is_prefilling(r) else "decode"]
        return column


# ------------------------------------------------------------------------------------ pages
def page_map(engine) -> dict:
    """Per physical page: its owner (a request id, or None), and which pages are shared by
    several requests (prefix cache) or free but still caching a prefix."""
    pool = engine.pool
    owners: list = [None] * pool.num_pages
    for rid, table in engine.kv.tables.items():
        for page in table.pages:
            if owners[page] is None:
                owners[page] = rid
    refs = pool.ref_counts
    shared = [p for p in range(pool.num_pages) if refs[p] > 1]
    cached_free = []
    if engine.prefix_cache is not None:
        cached_free = [p for p in engine.prefix_cache.pages if refs[p] == 0]
    return {"owners": owners, "shared": shared, "cached_free": cached_free,
            "page_size": pool.page_size, "num_pages": pool.num_pages}


# ------------------------------------------------------------------------------------ controls
def admission_name(engine) -> str:
    return getattr(engine.scheduler.admission, "name", type(engine.scheduler.admission).__name__)


def set_admission(engine, name: str) -> None:
    """Switch the admission policy of a live engine (takes effect at the next step)."""
    if name not in ADMISSION_POLICIES:
        raise ValueError(f"admission must be one of {', '.join(ADMISSION_POLICIES)}, got {name!r}")
    policy = make_admission(name, engine.config.watermark)
    engine.admission = engine.scheduler.admission = policy
    engine.config.admission = name


# ------------------------------------------------------------------------------------ memory
def forget_request(engine, request_id: str) -> None:
    """A finished request is delivered: drop the engine's record of it, so a server that runs
    for hours does not keep every request it ever served."""
    engine.forget(request_id)  # (a request with n > 1: every sample, once all have ended)


def trim_step_history(engine, keep: int) -> None:
    """Keep the last `keep` StepStats (the engine appends one per step, forever)."""
    if len(engine.step_stats) > 2 * keep:
        del engine.step_stats[:-keep]
