"""Notebook 06's checks (prefix caching): course_lib's cache passes on every
graded seed (that the generated reference passes and every mutant fails and every control passes on every graded seed is tested for
all notebooks in tests/test_exercise_table.py). Run times are printed (no timed assertion: speed is not a test)."""
from __future__ import annotations

import pytest

from autograder.controls import nb06_prefix_caching as controls
from autograder.exercises import of_module
from autograder.mutants import nb06_prefix_caching as mutants
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb06_prefix_caching")}


def test_course_lib_cache_passes():
    from course_lib.kv.prefix_cache import PrefixCache

    for seed in EXERCISES["StudentPrefixCache"].graded_seeds:
        assert verdict("StudentPrefixCache", PrefixCache, seed) is None


# Issue 24: each rule the notebook's block names, broken alone, fails with that rule's name.
RULE_MUTANTS = {
    "page_keys": {"linear work": ["keys_rehash_whole_prefix", "keys_copy_then_rehash_prefix",
                                  "keys_digest_of_prefix_text", "keys_whole_prefix", "keys_nested_chain"]},
    "StudentPrefixCache": {"looking up changes nothing": ["LookupSharesPages"], "fresh serials": ["SerialIsPage"],
                           "forget evicted pages": ["StaleChildByPage", "EvictDoesNothing"],
                           "never a wrong page": ["TrustsTheHash"], "duplicates": ["DuplicateTakesOver"],
                           "exact counters": ["HitRateIntegerDivision"], "longest prefix": ["LookupSkipsMisses"]},
}


@pytest.mark.parametrize("exercise,rule,name", [(e, r, n) for e, rules in RULE_MUTANTS.items()
                                                for r, names in rules.items() for n in names])
def test_the_failure_names_the_broken_rule(exercise, rule, name):
    for seed in EXERCISES[exercise].graded_seeds:
        message = verdict(exercise, getattr(mutants, name), seed)
        assert message is not None and message.startswith(f'Rule "{rule}": '), (seed, message)


def test_counted_tokens_count_what_is_read():
    from autograder.checks.nb06_prefix_caching import CountedTokens

    tokens = CountedTokens(range(10))
    assert len(tokens) == 10 and tokens.read == 0
    assert tokens[2:5] == [2, 3, 4] and tokens.read == 3
    assert tokens[7] == 7 and tokens.read == 4
    assert list(tokens) == list(range(10)) and tokens.read == 14
    assert tuple(tokens[:]) == tuple(range(10)) and tokens.read == 24


def test_a_linear_key_function_that_copies_its_input_passes():
    """Copying the input once (one read per token) is linear: the control keys_hash_and_page does it."""
    for seed in EXERCISES["page_keys"].graded_seeds:
        assert verdict("page_keys", controls.keys_hash_and_page, seed) is None
