"""One package per notebook; in each, `check_<adapter>(impl, seed=0)` for every exercise of
docs/exercises.md, in a file of its own (`_shared.py` holds what the notebook's checks share).
`CHECKS` maps an exercise (adapter) name to its notebook's module name."""
from autograder.exercises import EXERCISES
from autograder.notebooks import MODULES  # noqa: F401  (one module per notebook)

# exercise (adapter) name -> check module, derived from the one table (autograder/exercises.py)
CHECKS = {e.adapter: e.module for e in EXERCISES}


def get_check(exercise: str):
    """The check function of `exercise` (an adapter name), e.g. get_check("pad_batch")."""
    import importlib

    module = importlib.import_module(f"autograder.checks.{CHECKS[exercise]}")
    return getattr(module, f"check_{exercise}")
