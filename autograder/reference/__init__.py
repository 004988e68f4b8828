"""Working solutions of every exercise in docs/exercises.md, one module per notebook.

They are the notebooks' solution cells: each module imports only torch, the standard library
and course_lib pieces the exercise is allowed to use (never the piece it asks the student to
write), so a module's code can be pasted into a notebook as it is. The checks refuse code from
this package unless called with `_allow_reference=True` (the tests do that).
"""
from autograder.notebooks import MODULES  # noqa: F401  (one module per notebook)
