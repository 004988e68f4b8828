"""The hidden seeds live only on the instructor's side (issue 23, deliverable 4): the shipped table
of exercises holds none, everything that needs them reads the solution notebooks, the instructor's
key derives others, the checks take any seed, and the feedback names none."""
from __future__ import annotations

import dataclasses
import importlib
import random
from pathlib import Path

import nbformat
import pytest
import torch

from autograder import hidden_seeds as H
from autograder.checks import get_check
from autograder.exercises import BY_ADAPTER, EXERCISES, Exercise
from autograder.grade import hidden_line_ranges, without_hidden
from autograder.verdict import cell_plan

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_table_holds_no_hidden_seed():
    assert [f.name for f in dataclasses.fields(Exercise) if "seed" in f.name] == ["visible_seed"]
    text = (ROOT / "autograder" / "exercises.py").read_text(encoding="utf-8")
    assert "hidden_seeds=" not in text and "(1, 2)" not in text


def test_graded_seeds_are_read_from_the_solution_notebook(tmp_path):
    exercise = BY_ADAPTER["StudentPrefixCache"]
    assert exercise.graded_seeds == (0, 1) and exercise.hidden_seeds == (1,)
    source = nbformat.read(H.solution_notebook(exercise), as_version=4)
    for cell in source.cells:  # an instructor's copy with other hidden seeds: read from there
        cell.source = cell.source.replace("seed=1)", "seed=77)")
    (tmp_path / exercise.assignment).mkdir()
    nbformat.write(source, tmp_path / exercise.assignment / f"{exercise.assignment}.ipynb")
    assert H.graded_seeds(exercise, tmp_path) == (0, 77)
    with pytest.raises(H.NoSolutions, match="live only in the instructor's notebook"):
        H.graded_seeds(exercise, tmp_path / "nowhere")


def test_a_computed_seed_means_the_cell_s_own_literal_seeds():
    source = ("check_pad_batch(pad_batch)\n### BEGIN HIDDEN TESTS\nfor s in (5, 6):\n"
              "    check_pad_batch(pad_batch, seed=s)\ncheck_pad_batch(pad_batch, seed=9)\n### END HIDDEN TESTS")
    plan = {(p.seed, p.hidden) for p in cell_plan(source, hidden_line_ranges(source))}
    assert plan == {(0, False), (0, True), (9, True)}


KEY = "the instructor's secret"
CELL = ('checking("paged_waste")\ncheck_paged_waste(paged_waste, seed=0)\n### BEGIN HIDDEN TESTS\n'
        'check_paged_waste(paged_waste, seed=1)\ncheck_contiguous_waste(contiguous_waste, seed=1)\n'
        'check_paged_waste(paged_waste, 2)  # é\n### END HIDDEN TESTS')


def test_the_key_rewrites_only_the_hidden_seeds_deterministically():
    keyed = H.rewrite_cell(CELL, KEY)
    assert keyed == H.rewrite_cell(CELL, KEY) and keyed != H.rewrite_cell(CELL, KEY + "!")
    assert without_hidden(keyed) == without_hidden(CELL), "the visible part is untouched"
    visible, hidden = H.cell_seeds(keyed, "paged_waste")
    assert visible == (0,) and hidden == (H.derived_seed(KEY, "paged_waste", 1), H.derived_seed(KEY, "paged_waste", 2))
    assert H.cell_seeds(keyed, "contiguous_waste")[1] == (H.derived_seed(KEY, "contiguous_waste", 1),)
    assert all(s >= 1000 for s in hidden) and "# é" in keyed


def test_without_a_key_the_notebook_is_left_alone(monkeypatch):
    monkeypatch.delenv(H.KEY_ENV, raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL, metadata={"nbgrader": {"grade": True}})])
    assert H.keyed_source(nb) is nb
    monkeypatch.setenv(H.KEY_ENV, KEY)
    assert H.keyed_source(nb).cells[0].source == H.rewrite_cell(CELL, KEY) and nb.cells[0].source == CELL


def test_the_feedback_names_no_hidden_seed():
    entry = {"replay": [{"exercise": "x", "seed": 0}, {"exercise": "x", "seed": 1}, {"exercise": "x", "seed": 123456}],
             "flags": ["check_x(seed=1, 0): a copy", "check_x(seed=0): fine", "seed 123456 leaked in prose"]}
    shown = H.hide_in(entry, {1, 123456})
    assert [r["seed"] for r in shown["replay"]] == [0, None, None] and shown["replay"][1]["hidden"] is True
    assert shown["flags"] == ["check_x(seed=hidden, 0): a copy", "check_x(seed=0): fine", "seed hidden leaked in prose"]


# The checks take any int seed: every exercise's reference and controls pass on a few random seeds
# (what a key derives), so that grading with a key never fails a right answer.
RANDOM_SEEDS = random.Random(23).sample(range(1000, 2**31), 2)


def _controls(exercise):
    try:
        module = importlib.import_module(f"autograder.controls.{exercise.module}")
    except ModuleNotFoundError:
        return []
    return module.CONTROLS.get(exercise.adapter, [])


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.adapter)
def test_references_and_controls_pass_on_derived_seeds(exercise):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = getattr(importlib.import_module(f"autograder.reference.{exercise.module}"), exercise.adapter)
        check = get_check(exercise.adapter)
        for impl in [reference, *_controls(exercise)]:
            for seed in RANDOM_SEEDS:
                assert check(impl, seed, _allow_reference=True) is None, (getattr(impl, "__name__", impl), seed)
    finally:
        torch.set_num_threads(threads)
