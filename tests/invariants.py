"""Bookkeeping invariants of the KV memory, checked after every engine step."""
from collections import Counter


def check_engine_invariants(engine) -> None:
    pool, kv = engine.pool, engine.kv
    pool.check_invariants()  # used + free == total; free <=> refcount 0
    owners = Counter()
    for rid, table in kv.tables.items():
        assert len(set(table.pages)) == len(table.pages), f"{rid} holds a page twice: {table.pages}"
        owners.update(table.pages)
    for page, count in owners.items():
        assert pool.ref_counts[page] == count, (
            f"page {page} is in {count} page tables but has refcount {pool.ref_counts[page]}")
    for page, rc in enumerate(pool.ref_counts):
        if rc:
            assert page in owners, f"page {page} has refcount {rc} but no request holds it (leak)"
    for r in engine.scheduler.running:
        if r.finish_reason is None:
            assert r.request_id in kv.tables, f"running request {r.request_id} has no page table"
            assert len(kv.tables[r.request_id].pages) * kv.page_size >= r.num_computed_tokens
    for r in engine.scheduler.waiting:
        assert r.request_id not in kv.tables, f"waiting request {r.request_id} still holds pages"
    if engine.prefix_cache is not None:
        for page in engine.prefix_cache.pages:
            assert pool.ref_counts[page] > 0 or pool.is_free(page), f"cached page {page} is lost"


def check_all_finished(engine) -> None:
    reasons = {"eos", "length", "stop", "aborted", "error"}
    for r in engine.requests.values():
        assert r.is_finished, f"request {r.request_id} was silently lost ({r.status})"
        assert r.finish_reason.value in reasons
        if r.finish_reason.value == "error":
            assert r.error, "a failed request must say why"
    assert engine.pool.num_free_pages == engine.pool.num_pages, "pages leaked once everything finished"
    assert not engine.kv.tables
