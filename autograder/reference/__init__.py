"""Working solutions of every exercise in docs/exercises.md, one module per notebook.

They are the notebooks' solution cells: each module imports only torch, the standard library
and course_lib pieces the exercise is allowed to use (never the piece it asks the student to
write), so a module's code can be pasted into a notebook as it is. The checks refuse code from
this package unless called with `_allow_reference=True` (the tests do that).
"""
MODULES = [
    "nb00_setup",
    "nb01_static_batching",
    "nb02_continuous_batching",
    "nb03_paged_kv",
    "nb04_paged_attention",
    "nb05_hundred_users",
    "nb06_prefix_caching",
    "nb07_admission_control",
]
