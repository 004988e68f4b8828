"""Correct but differently written solutions of the exercises, one module per notebook (mirroring
autograder/mutants/): `CONTROLS = {adapter: [...]}` in each. Every control must pass its exercise's
check on every graded seed: a check that fails one is a false alarm. Modules import nothing from the
autograder, so a control pastes into a notebook cell as it is."""
