"""Notebook 09's checks (speculative decoding: the acceptance rule and the scheduler's rollback): course_lib's
own pieces pass on every graded seed, handing course_lib in is
refused (also through the grading membrane), every rule of the notebook's blocks has a mutant whose
failure names it on every graded seed, and the sampled rule's statistics pass correct rules on seeds
nobody chose (that the generated reference passes and every mutant fails and every control passes on every graded seed is tested for
all notebooks in tests/test_exercise_table.py). Run times are printed (no timed assertion)."""
from __future__ import annotations

import re

import pytest

from autograder import record
from autograder._checking import REFERENCE_MESSAGE
from autograder.checks import get_check
from autograder.controls import nb09_speculative_decoding as controls
from autograder.exercises import of_module
from autograder.mutants import nb09_speculative_decoding as mutants
from autograder.reference import nb09_speculative_decoding as reference
from autograder.replay import read_records, replay
from check_support import verdict

EXERCISES = {e.adapter: e for e in of_module("nb09_speculative_decoding")}


def test_course_lib_counterparts_pass():
    """course_lib's acceptance rule, and a scheduler whose accept_drafts runs course_lib's body (its own
    method, so that the check's refusal of an inherited one does not apply), pass with the reference allowed."""
    from course_lib.scheduler.base import SchedulerBase
    from course_lib.scheduler.continuous import ContinuousScheduler
    from course_lib.spec.verify import target_tokens

    class CourseLibBody(ContinuousScheduler):
        def accept_drafts(self, request, entry, targets):
            return SchedulerBase.accept_drafts(self, request, entry, targets)

    for exercise, impl in (("target_tokens", target_tokens), ("StudentRollback", CourseLibBody)):
        for seed in EXERCISES[exercise].graded_seeds:
            assert verdict(exercise, impl, seed) is None, exercise


def test_handing_in_course_lib_is_refused():
    """course_lib's function or scheduler as they are, a function that calls course_lib's, and a subclass
    whose accept_drafts delegates with super(): no credit."""
    from course_lib.scheduler.continuous import ContinuousScheduler
    from course_lib.spec.verify import target_tokens

    def wrapper(*args):
        return target_tokens(*args)

    class Delegating(ContinuousScheduler):
        def accept_drafts(self, request, entry, targets):
            return super().accept_drafts(request, entry, targets)

    for exercise, impl in (("target_tokens", target_tokens), ("target_tokens", wrapper),
                           ("StudentRollback", ContinuousScheduler), ("StudentRollback", Delegating)):
        with pytest.raises(AssertionError, match=re.escape(REFERENCE_MESSAGE)):
            get_check(exercise)(impl, 0)


def _wrapper_of_course_lib(*args):
    from course_lib.spec.verify import target_tokens

    return target_tokens(*args)


def test_a_wrapper_of_course_lib_is_refused_on_the_graders_replay_too(tmp_path):
    """The grader's verdict is the replay's: the calls into course_lib's rule, recorded in the sandbox, must
    fail the replay as well (the check reads them once the watch has closed, when the replay has filled them)."""
    path = tmp_path / "record.jsonl"
    record.start(str(path))
    try:
        with pytest.raises(AssertionError, match=re.escape(REFERENCE_MESSAGE)):
            get_check("target_tokens")(_wrapper_of_course_lib, seed=0)
    finally:
        record.SESSION = None
    entries, problems = read_records(path)
    assert not problems and len(entries) == 1, problems
    ok, message = replay(get_check("target_tokens"), entries[0])
    assert not ok and REFERENCE_MESSAGE in message, message


RULE_MUTANTS = {
    "target_tokens": {"one token per position": ["tokens_cut_at_rejection"],
                      "greedy: the target's argmax": ["greedy_keeps_drafts"],
                      "sample from the request's p": ["softmax_of_raw_logits"],
                      "keep with probability min(1, p/q)": ["keeps_with_p", "certain_guess_always_kept"],
                      "resample from the residual": ["resamples_from_p"],
                      "a bonus token when all agree": ["bonus_is_argmax"]},
    "StudentRollback": {"the agreeing prefix": ["KeepsEveryDraft", "KeepsRejectedDraft", "ComparesTokensWithIs"],
                        "stop where the answer stops": ["StopsOnlyAtTheEnd", "ForgetsTheReason"],
                        "progress counts kept tokens": ["ProgressPastTheDrafts", "ProgressOneShort"],
                        "rejected pages go back": ["NeverTruncates", "TruncatesOneSlotLate"]},
}


@pytest.mark.parametrize("exercise,rule,name", [(e, r, n) for e, rules in RULE_MUTANTS.items()
                                                for r, names in rules.items() for n in names])
def test_the_failure_names_the_broken_rule(exercise, rule, name):
    for seed in EXERCISES[exercise].graded_seeds:
        message = verdict(exercise, getattr(mutants, name), seed)
        assert message is not None and message.startswith(f'Rule "{rule}": '), (seed, message)


def test_every_mutant_is_listed_under_a_rule():
    assert set(RULE_MUTANTS) == set(EXERCISES), "every exercise of the notebook has its mutants under their rules"
    for exercise, rules in RULE_MUTANTS.items():
        listed = {name for names in rules.values() for name in names}
        assert listed == {m.__name__ for m in mutants.MUTANTS[exercise]}, exercise


@pytest.mark.parametrize("impl", [reference.target_tokens, controls.target_tokens_inverse_cdf],
                         ids=["reference", "control"])
def test_the_statistics_pass_a_correct_rule_on_seeds_nobody_chose(impl):
    """z = 6 on every rate and frequency: a correct rule (two different ways of drawing) passes on 12 seeds
    beyond the graded ones, and gives the same verdict twice on one seed (the check seeds the generator)."""
    for seed in range(100, 112):
        assert verdict("target_tokens", impl, seed) is None, seed
    assert verdict("target_tokens", mutants.keeps_with_p, 7) == verdict("target_tokens", mutants.keeps_with_p, 7)
