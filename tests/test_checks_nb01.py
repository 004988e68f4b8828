"""Notebook 01's checks (static batching): the generated reference and course_lib's counterparts pass on
every graded seed (that every mutant fails and every control passes on every graded seed, with a
message naming the rule, is tested for all notebooks in tests/test_exercise_table.py). Also the
contiguous KV cache the cached exercise decodes over. Run times are printed (no timed assertion:
speed is not a test)."""
from __future__ import annotations

import random

import pytest
import torch

from autograder import fixtures
from autograder.checks import get_check
from autograder.exercises import of_module
from autograder.mutants import nb01_static_batching as mutants
from autograder.reference import nb01_static_batching as reference
from check_support import counterpart, verdict

# Each hand-written mutant and the rule of the exercise's "The rules the check holds you to" block that
# it breaks (and no other): the check's failure must name that rule, on every graded seed.
RULE_OF = {
    "pad_batch_right": "left padding",
    "pad_batch_inverted_mask": "mask from lengths",
    "pad_batch_int_mask": "shapes and dtypes",
    "pad_batch_ignores_pad_id": "left padding",
    "pad_batch_mask_from_ids": "mask from lengths",
    "pad_batch_accepts_empty": "bad input",
    "pad_batch_no_checks": "bad input",
    "pad_batch_pads_in_place": "inputs unchanged",
    "static_generate_right_padding": "greedy, row by row",
    "static_generate_attends_to_padding": "greedy, row by row",
    "static_generate_no_eos_cut": "eos ends a row",
    "static_generate_drops_eos": "eos ends a row",
    "static_generate_stops_at_first_eos": "stop when all done",
    "static_generate_runs_max_tokens": "stop when all done",
    "static_generate_one_at_a_time": "the whole rectangle",
    "static_generate_drops_finished_rows": "finished rows stay",
    "static_generate_uses_a_cache": "the whole rectangle",
    "static_generate_eos_by_identity": "eos ends a row",
    "static_generate_one_token_too_many": "max_tokens",
    "static_generate_extends_the_prompts": "inputs unchanged",
    "cached_recomputes_everything": "one token per row",
    "cached_decode_positions_are_columns": "no gaps in positions",
    "cached_decode_position_off_by_one": "no gaps in positions",
    "cached_attends_to_prompt_padding": "greedy, row by row",
    "cached_runs_max_tokens": "stop when all done",
    "cached_one_token_too_many": "max_tokens",
    "cached_prefills_column_by_column": "one prefill",
    "cached_drops_eos": "eos ends a row",
    "cached_feeds_stale_token": "greedy, row by row",
    "cached_eos_by_identity": "eos ends a row",
    "cached_extends_the_prompts": "inputs unchanged",
    "padding_waste_decodes_max_steps": "decode until the longest",
    "padding_waste_prefill_only": "decode until the longest",
    "padding_waste_over_useful": "padding over all computed",
    "padding_waste_useful_fraction": "padding over all computed",
    "padding_waste_no_validation": "bad input",
    "padding_waste_validates_outputs_only": "bad input",
    "padding_waste_counts_last_token": "real slots",
    "padding_waste_rounded": "exact",
}

EXERCISES = {e.adapter: e for e in of_module("nb01_static_batching")}


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None
        assert verdict(exercise, counterpart(exercise), seed) is None


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_handing_in_course_lib_or_a_wrapper_of_it_is_refused(exercise):
    check = get_check(exercise)
    piece = counterpart(exercise)

    def wrapper(*args):
        return piece(*args)

    for impl in (piece, wrapper):
        with pytest.raises(AssertionError, match="course_lib's reference"):
            check(impl)


def test_the_pass_shape_rules_name_the_rule():
    """The no-cache loop handed in as the cached one (right tokens) fails on the decode pass's size;
    the cached loop handed in as the no-cache baseline fails on the same rule, the other way round."""
    cached, plain = counterpart("static_generate_cached"), counterpart("static_generate")
    message = verdict("static_generate_cached", lambda *a: plain(*a), 0)
    assert "decode step" in message and "one new token" in message, message
    message = verdict("static_generate", lambda *a: cached(*a), 0)
    assert "KV cache" in message and "NEXT exercise" in message, message


@pytest.mark.parametrize("exercise, mutant", [(e, m) for e in sorted(EXERCISES) for m in mutants.MUTANTS[e]],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_each_mutant_fails_naming_the_rule_it_breaks(exercise, mutant):
    assert mutant.__name__ in RULE_OF, f"say which rule {mutant.__name__} breaks in RULE_OF"
    for seed in EXERCISES[exercise].graded_seeds:
        message = verdict(exercise, mutant, seed)
        assert message and message.startswith(f'Rule "{RULE_OF[mutant.__name__]}": '), (seed, message)


def test_positions_are_read_whether_the_model_is_called_or_its_forward():
    """The rule "no gaps in positions" reads the positions from the model's forward frame: a loop that
    calls `model.forward(...)` (no module hooks of its own) is held to it as well as one calling `model(...)`."""
    def positions_off_by_one_via_forward(model, prompts, max_tokens, eos_id):
        original = type(model).__call__
        try:  # route the cache's model(...) calls to model.forward(...)
            type(model).__call__ = lambda self, *a, **k: self.forward(*a, **k)
            return mutants.cached_decode_position_off_by_one(model, prompts, max_tokens, eos_id)
        finally:
            type(model).__call__ = original

    message = verdict("static_generate_cached", positions_off_by_one_via_forward, 0)
    assert message and message.startswith('Rule "no gaps in positions"'), message


# ------------------------------------------------------------------------------ the contiguous cache
def test_cached_forward_equals_the_dense_model_column_by_column():
    from course_lib.model.contiguous_cache import ContiguousKVCache
    from course_lib.static_batching import pad_batch

    model = fixtures.random_model(3)
    prompts = fixtures.random_prompts(random.Random(3), 4, model.config.vocab_size, lo=1, hi=9)
    ids, mask = pad_batch(prompts, 0)
    cache = ContiguousKVCache(model, batch_size=4, max_len=ids.shape[1] + 1)
    logits = cache.forward(model, ids, mask, (mask.long().cumsum(1) - 1).clamp(min=0))
    for row, prompt in enumerate(prompts):
        alone = model.dense_logits([prompt])[0]
        assert torch.allclose(logits[row, -len(prompt):], alone, atol=1e-10), f"row {row}"
    assert cache.length == ids.shape[1]
    assert cache.num_bytes == 2 * model.config.num_layers * 4 * (ids.shape[1] + 1) * 2 * model.config.head_dim * 8


def test_cache_refuses_a_pass_it_cannot_hold_or_a_shrunk_batch():
    from course_lib.model.contiguous_cache import ContiguousKVCache

    model = fixtures.random_model(0)
    cache = ContiguousKVCache(model, batch_size=2, max_len=3)
    ones = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="reserves 3 columns"):
        cache.forward(model, torch.ones(2, 4, dtype=torch.long), ones, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="holds 2 rows"):
        cache.forward(model, torch.ones(1, 1, dtype=torch.long), ones[:1, :1], torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        ContiguousKVCache(model, batch_size=2, max_len=0)


def test_course_lib_pieces_refuse_bad_input():
    from course_lib.static_batching import pad_batch, padding_waste

    with pytest.raises(ValueError, match="at least one prompt"):
        pad_batch([], 0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        pad_batch([[3], []], 0)
    with pytest.raises(ValueError, match="3 prompt lengths and 2 output lengths"):
        padding_waste([1, 2, 3], [1, 2])
