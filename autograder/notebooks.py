"""The course's notebooks, by module name: checks, reference solutions and mutants each hold one
module of this name per notebook (e.g. `autograder.checks.nb03_paged_kv`)."""
MODULES = [
    "nb00_setup",
    "nb01_static_batching",
    "nb02_continuous_batching",
    "nb03_paged_kv",
    "nb04_paged_attention",
    "nb05_hundred_users",
    "nb06_prefix_caching",
    "nb07_admission_control",
    "nb09_speculative_decoding",
]
