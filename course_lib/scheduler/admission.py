"""Admission control: may this waiting request start now?

The scheduler has already checked that the pages for the request's first chunk are free.
A policy decides whether admitting it is *wise*: whether the pool will still have room for
the requests already running to keep growing.

Every policy has one method, `can_admit(request, num_new_tokens, cached_pages, kv, running)`.
"""
from __future__ import annotations


class NoAdmissionControl:
    """Admit whenever a slot and the first chunk's pages are free. Instructive: under load the
    pool fills, running requests cannot grow, and the engine has to preempt (or fail) them."""

    name = "none"

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        return True


class ReserveAdmission:
    """Orca-style worst case: admit only if the pool can hold this request *and* every running
    one at prompt + max_tokens. Nothing is ever preempted; memory sits reserved but unused."""

    name = "reserve"

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        limit = kv.max_model_len
        outstanding = 0
        for other in running:
            if other.finish_reason is None:
                held = len(kv.tables[other.request_id].pages) if other.request_id in kv.tables else 0
                outstanding += max(0, kv.pages_to_hold(other.max_kv_slots(limit)) - held)
        worst_new = request.max_kv_slots(limit) - len(cached_pages) * kv.page_size
        need = kv.num_pages_needed(request, max(worst_new, num_new_tokens), cached_pages)
        return need + outstanding <= kv.num_free_pages


class WatermarkAdmission:
    """Admit if, after the request's first chunk is placed, at least `watermark` of the pool is
    still free: headroom for the running requests' next tokens (vLLM's watermark idea)."""

    name = "watermark"

    def __init__(self, watermark: float = 0.05):
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.watermark = watermark

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running) -> bool:
        need = kv.num_pages_needed(request, num_new_tokens, cached_pages)
        return kv.num_free_pages - need >= self.watermark * kv.num_pages


def make_admission(name: str, watermark: float = 0.05):
    if name == "none":
        return NoAdmissionControl()
    if name == "reserve":
        return ReserveAdmission()
    if name == "watermark":
        return WatermarkAdmission(watermark)
    raise ValueError(f"unknown admission policy {name!r}; choose none, reserve or watermark")
