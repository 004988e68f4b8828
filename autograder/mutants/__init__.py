"""Known-buggy implementations of every exercise, one module per notebook.

`REGISTRY[exercise]` lists the mutants of one exercise (an adapter name of docs/exercises.md);
each must fail at least one check of that exercise, and each check must fail at least one of
them (tests/test_autograder_checks.py). Mutant modules import nothing from the autograder, so a
module's source can be pasted into a notebook cell as it is: `E2E` names, per notebook, the
mutant the end-to-end grading test plants in a solution notebook.
"""
from __future__ import annotations

import importlib

from autograder.notebooks import MODULES  # noqa: F401  (one module per notebook)

# notebook module -> (exercise, mutant name) planted by the end-to-end test (one per notebook). Chosen
# among exercises no other solution calls (a broken pad_batch would also break static_generate) and
# among mutants that fail fast (a leaking pool would stall the notebook's own engine demos).
E2E = {
    "nb00_setup": ("kv_bytes_per_token", "kv_uses_num_heads"),
    "nb01_static_batching": ("padding_waste", "padding_waste_decodes_max_steps"),
    "nb02_continuous_batching": ("mean_batch_occupancy", "occupancy_unweighted"),
    "nb03_paged_kv": ("paged_waste", "paged_waste_extra_page"),  # build_flat_batch calls slot_mapping
    "nb04_paged_attention": ("paged_attention_vectorized", "vectorized_repeat_not_interleave"),
    "nb05_hundred_users": ("latency_summary", "summary_nearest_rank"),
    "nb06_prefix_caching": ("page_keys", "keys_not_chained"),
    "nb07_admission_control": ("StudentWatermark", "AdmitsEverything"),
    "nb09_speculative_decoding": ("target_tokens", "greedy_keeps_drafts"),
}


def _load():
    registry: dict[str, list] = {}
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        for exercise, mutants in module.MUTANTS.items():
            registry.setdefault(exercise, []).extend(mutants)
    return registry


REGISTRY = _load()


def module_of(exercise: str) -> str:
    """The notebook module an exercise belongs to (e.g. "pad_batch" -> "nb01_static_batching")."""
    from autograder.checks import CHECKS

    return CHECKS[exercise]
