"""Notebook 00's checks (setup): the generated reference and course_lib's counterparts pass on every
graded seed (that every mutant fails and every control passes on every graded seed is tested for all
notebooks in tests/test_exercise_table.py); here, each mutant fails on every graded seed naming the
rule of the notebook's rules block it breaks (`RULE_OF`). Run times are printed (no timed assertion:
speed is not a test)."""
from __future__ import annotations

import pytest

from autograder.checks import get_check
from autograder.exercises import of_module
from autograder.mutants import nb00_setup as mutants
from autograder.reference import nb00_setup as reference
from check_support import counterpart, verdict

# Each hand-written mutant and the rule of the exercise's "The rules the check holds you to" block that
# it breaks (and no other): the check's failure must name that rule, on every graded seed.
RULE_OF = {
    "kv_uses_num_heads": "kv heads only",
    "kv_forgets_values": "keys and values",
    "kv_forgets_layers": "every layer",
    "kv_uses_hidden_size": "head_dim as given",
    "kv_returns_float": "an exact int",
    "kv_head_dim_from_hidden": "head_dim as given",
    "kv_forgets_bytes": "bytes per number",
    "kv_counts_bits_through_a_float": "an exact int",
    "kv_notes_the_count_on_the_config": "inputs unchanged",
    "answer_without_prompt_format": "as trained",
    "answer_echoes_prompt": "the answer alone",
    "answer_ignores_max_tokens": "max_tokens",
    "answer_skips_engine": "through the engine",
    "answer_returns_ids": "the answer alone",
    "answer_reuses_first_engine": "the model given",
    "answer_keeps_special_tokens": "the answer alone",
    "answer_samples": "greedy answer",
}

EXERCISES = {e.adapter: e for e in of_module("nb00_setup")}


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None
        assert verdict(exercise, counterpart(exercise), seed) is None


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_handing_in_course_lib_or_a_wrapper_of_it_is_refused(exercise):
    piece = counterpart(exercise)

    def wrapper(*args, **kwargs):
        return piece(*args, **kwargs)

    for impl in (piece, wrapper):
        with pytest.raises(AssertionError, match="course_lib's reference"):
            get_check(exercise)(impl)


def test_answer_reuse_mutant_fails_on_a_fresh_start():
    """The engine-reusing mutant keeps module state: reset it, so seed 0 alone must catch it."""
    mutants._FIRST_ENGINE.clear()
    message = verdict("answer", mutants.answer_reuses_first_engine, 0)
    assert message and "another_model" in message, message


@pytest.mark.parametrize("exercise, mutant", [(e, m) for e in sorted(EXERCISES) for m in mutants.MUTANTS[e]],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_each_mutant_fails_naming_the_rule_it_breaks(exercise, mutant):
    assert mutant.__name__ in RULE_OF, f"say which rule {mutant.__name__} breaks in RULE_OF"
    for seed in EXERCISES[exercise].graded_seeds:
        mutants._FIRST_ENGINE.clear()
        message = verdict(exercise, mutant, seed)
        assert message and message.startswith(f'Rule "{RULE_OF[mutant.__name__]}": '), (seed, message)


def test_the_counterpart_is_not_in_the_file_notebook_01_sends_students_to_read():
    """Notebook 01 asks students to read course_lib/model/contiguous_cache.py: notebook 00's answer
    (kv_bytes_per_token) must live elsewhere, and the table must point at where it lives."""
    import inspect

    import course_lib.model.contiguous_cache as contiguous_cache

    assert EXERCISES["kv_bytes_per_token"].counterpart == "course_lib.model.kv_footprint:kv_bytes_per_token"
    source = inspect.getsource(contiguous_cache)
    assert "kv_bytes_per_token" not in source and "num_kv_heads * " not in source
