"""autograder: the checks that grade the course's exercises, and the tools around them.

- `autograder.checks.<nbXX_name>.check_<adapter>(impl, seed=0)`: one check per exercise of
  docs/exercises.md. A check returns None or raises AssertionError with a message a student can
  act on. Notebook test cells call them; hidden tests call them with other seeds.
- `autograder.reference`: a working implementation of every adapter (the notebooks' solutions).
- `autograder.mutants`: realistic buggy implementations; `autograder.mutants.REGISTRY` maps each
  exercise to them. Every mutant must fail a check of its exercise (tests/test_autograder_checks.py).
- `python -m autograder grade NOTEBOOK... --json PATH`: grade submissions without nbgrader's
  database; `python -m autograder demo-course`: the instructor's nbgrader flow, end to end.

See docs/grading.md.
"""
__version__ = "0.1.0"
