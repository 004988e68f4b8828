"""One module per notebook; in each, `check_<adapter>(impl, seed=0)` for every exercise of
docs/exercises.md. `CHECKS` maps exercise (adapter) name -> (module name, check name)."""
from autograder.notebooks import MODULES  # noqa: F401  (one module per notebook)

CHECKS = {
    "kv_bytes_per_token": "nb00_setup",
    "answer": "nb00_setup",
    "pad_batch": "nb01_static_batching",
    "padding_waste": "nb01_static_batching",
    "static_generate": "nb01_static_batching",
    "StudentScheduler": "nb02_continuous_batching",
    "mean_batch_occupancy": "nb02_continuous_batching",
    "StudentBlockPool": "nb03_paged_kv",
    "slot_mapping": "nb03_paged_kv",
    "paged_waste": "nb03_paged_kv",
    "contiguous_waste": "nb03_paged_kv",
    "paged_attention_loops": "nb04_paged_attention",
    "paged_attention_vectorized": "nb04_paged_attention",
    "latency_summary": "nb05_hundred_users",
    "run_closed_loop": "nb05_hundred_users",
    "page_keys": "nb06_prefix_caching",
    "StudentPrefixCache": "nb06_prefix_caching",
    "StudentWatermark": "nb07_admission_control",
    "preemption_report": "nb07_admission_control",
}


def get_check(exercise: str):
    """The check function of `exercise` (an adapter name), e.g. get_check("pad_batch")."""
    import importlib

    module = importlib.import_module(f"autograder.checks.{CHECKS[exercise]}")
    return getattr(module, f"check_{exercise}")
