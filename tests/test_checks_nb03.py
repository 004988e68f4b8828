"""Notebook 03's checks (paged KV): the generated reference and course_lib's counterparts pass on every
graded seed; handing in course_lib (or a thin wrapper of it) is refused; each mutant listed in
RULE_MESSAGES (the pool) or FLAT_BATCH_MESSAGES (the flat batch) fails on seed 0 with a message that
holds the words listed for it; and a few single cases (both hook defaults in one message,
ScheduledRequest.slots refused, the page grid, BlockPool.free all or nothing). That every mutant fails
and every control passes on every graded seed is tested for all notebooks in
tests/test_exercise_table.py, which asks of a mutant's message only that it be longer than 40
characters and not say "internal": it looks for no rule's name, so only the two lists here tie a
message to what its mutant broke. Run times are printed by check_support.verdict (no timed assertion:
speed is not a test)."""
from __future__ import annotations

import pytest
import torch

from autograder.checks import get_check
from autograder.exercises import of_module
from autograder.mutants import nb03_paged_kv as mutants
from autograder.reference import nb03_paged_kv as reference
from check_support import counterpart, verdict

EXERCISES = {e.adapter: e for e in of_module("nb03_paged_kv")}


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_reference_and_course_lib_pass_every_graded_seed(exercise):
    for seed in EXERCISES[exercise].graded_seeds:
        assert verdict(exercise, getattr(reference, exercise), seed) is None
        assert verdict(exercise, counterpart(exercise), seed) is None


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_handing_in_course_lib_or_a_wrapper_of_it_is_refused(exercise):
    check = get_check(exercise)
    piece = counterpart(exercise)
    if isinstance(piece, type):
        wrapper = type("Wrapper", (piece,), {})
    else:
        def wrapper(*args):
            return piece(*args)
    for impl in (piece, wrapper):
        with pytest.raises(AssertionError, match="course_lib's reference"):
            check(impl)


# The pool's rules about the prefix cache's hooks (and two older ones), each pinned to the mutant that
# breaks it alone and the words of the message that names it.
RULE_MESSAGES = {
    "NeverEvicts": "once for each cached page handed out",
    "EvictsEveryPage": "only for pages whose contents are cached",
    "EvictsOnFree": "keeps its contents when its last owner frees it",
    "SharedFreePageStaysCached": "hits the cached page",
    "PartialAllocation": "unchanged",
    "NoDoubleFreeCheck": "double free",
    "FreeNotAtomic": 'Rule "all or nothing"',
    "FreeDuplicatesPassValidation": "listed twice",
}


@pytest.mark.parametrize("mutant", sorted(RULE_MESSAGES))
def test_each_pool_rule_is_named_by_its_message(mutant):
    message = verdict("StudentBlockPool", getattr(mutants, mutant), 0)
    assert message and RULE_MESSAGES[mutant] in message, message


class _EvictHookOn(reference.StudentBlockPool):
    def __init__(self, num_pages, page_size):
        super().__init__(num_pages, page_size)
        self.on_evict = lambda page: None


class _NoIsCachedHook(reference.StudentBlockPool):
    def __init__(self, num_pages, page_size):
        super().__init__(num_pages, page_size)
        del self.is_cached


class _PageFiveCached(reference.StudentBlockPool):
    def __init__(self, num_pages, page_size):
        super().__init__(num_pages, page_size)
        self.is_cached = lambda page: page == 5


@pytest.mark.parametrize("pool", [_EvictHookOn, _NoIsCachedHook, _PageFiveCached], ids=lambda c: c.__name__)
def test_one_message_names_both_hook_defaults(pool):
    """Whichever hook starts wrong, the message states both defaults: the blind trial met them one run
    at a time."""
    message = verdict("StudentBlockPool", pool, 0)
    assert message and 'Rule "hooks start off"' in message, message
    assert "self.on_evict = None" in message and "self.is_cached = lambda page: False" in message, message


# The flat batch's rules, each pinned to the mutant that breaks it alone and the words of its message.
FLAT_BATCH_MESSAGES = {
    "flat_positions_off_by_one": "Off by one",
    "flat_positions_from_zero": "not 0",
    "flat_slot_from_logical_page": "Those are token positions",
    "flat_query_start_loc_missing_last": "one offset more than there are sequences",
    "flat_seq_lens_new_tokens": "not only the new ones",
    "flat_seq_lens_context_only": "start + num_new_tokens",
    "flat_prefills_first": "in the order of output.scheduled",
    "flat_padding_writes_slot_zero": "pad_slot",
    "flat_padding_without_sequences": "sequence of its own",
    "flat_block_tables_int64": "expected torch.int32",
    "flat_block_tables_column_major": "not contiguous",
    "flat_clears_the_step": 'Rule "inputs unchanged"',
}


@pytest.mark.parametrize("mutant", sorted(FLAT_BATCH_MESSAGES))
def test_each_flat_batch_rule_is_named_by_its_message(mutant):
    message = verdict("build_flat_batch", getattr(mutants, mutant), 0)
    assert message and FLAT_BATCH_MESSAGES[mutant] in message, message


def test_the_flat_batch_check_refuses_the_request_slots_helper():
    """ScheduledRequest.slots is course_lib's slot map: the student's builder computes its own."""
    def uses_request_slots(output, page_size, device="cpu", pad_slot=0):
        batch = reference.build_flat_batch(output, page_size, device, pad_slot)
        batch.slot_mapping = torch.tensor([pad_slot] * output.num_padded_tokens
                                          + [x for s in output.scheduled for x in s.slots(page_size)])
        return batch

    with pytest.raises(AssertionError, match="it calls course_lib.scheduler.output.slots"):
        get_check("build_flat_batch")(uses_request_slots)


def test_the_page_grid_shows_the_chosen_moments():
    """viz.page_grid draws one panel per moment, titled with the step and the pages in use."""
    from autograder import fixtures
    from course_lib import EngineConfig, LLMEngine, SamplingParams, viz

    engine = LLMEngine(fixtures.random_model(0), EngineConfig(page_size=4, num_pages=12, max_num_seqs=3,
                                                              admission="none", record_page_owners=True))
    engine.generate([[5, 6, 7], [8, 9, 10, 11, 12], [13] * 9, [14, 15]], SamplingParams(max_tokens=6))
    fig = viz.page_grid(engine.step_stats, num_moments=3)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3 and all(t.startswith("step ") and "/12 pages" in t for t in titles), titles
    with pytest.raises(ValueError, match="record_page_owners"):
        viz.page_grid(LLMEngine(fixtures.random_model(0), EngineConfig()).step_stats)


def test_course_lib_block_pool_free_is_all_or_nothing():
    """The exercise's counterpart keeps the rule it grades: a double free anywhere in the list (a page
    listed more times than it has owners, or one already free) raises before any page is released."""
    from course_lib.kv.block_pool import BlockPool

    pool = BlockPool(4, 4)
    held = pool.allocate(3)
    pool.share(held[1])
    before = (list(pool.ref_counts), pool.num_free_pages)
    for bad in ([held[0], held[0]], [held[1], held[2], 3], [held[2], held[1], held[1], held[1]]):
        with pytest.raises(RuntimeError, match="double free"):
            pool.free(bad)
        assert (list(pool.ref_counts), pool.num_free_pages) == before, f"free({bad}) changed the books"
    pool.free([held[1], held[1], held[0]])  # two owners listed twice: fine
    assert pool.ref_counts[held[1]] == 0 and pool.num_free_pages == 3
    pool.check_invariants()
