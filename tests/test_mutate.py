"""Mutation testing (`python -m autograder mutate`): the generator finds mutants in every
exercise's reference, the equivalence notes all refer to real mutants, and a fast subset of
exercises has its non-equivalent mutants killed (the full run is a command, not a CI test:
docs/grading.md has its report)."""
from __future__ import annotations

import pytest

from autograder import mutate
from autograder.exercises import BY_ADAPTER, EXERCISES

FAST_SUBSET = ["slot_mapping", "paged_waste", "contiguous_waste"]


@pytest.fixture(scope="module")
def generated():
    return {e.adapter: mutate.generate(e) for e in EXERCISES}


def test_every_exercise_has_mutants_inside_its_own_definition(generated):
    for adapter, mutants in generated.items():
        assert mutants, f"cosmic-ray found nothing to mutate in {adapter}'s reference"
        source = mutate.reference_path(BY_ADAPTER[adapter]).read_text()
        spans = [mutate._definition_span(source, name) for name in mutate.targets(BY_ADAPTER[adapter])]
        assert all(any(first <= m.line <= last for first, last in spans) for m, _ in mutants)
        assert len({src for _, src in mutants}) == len(mutants), "duplicate mutants are kept once"


def test_equivalence_notes_name_real_mutants_and_give_a_reason(generated):
    keys = {m.key for mutants in generated.values() for m, _ in mutants}
    for key, reason in mutate.load_equivalents().items():
        assert key in keys, f"stale equivalence note (no such mutant any more): {key}"
        assert len(reason) > 15, f"an equivalence note needs a reason: {key}"


def test_a_fast_subset_of_exercises_kills_every_non_equivalent_mutant():
    exercises = [BY_ADAPTER[a] for a in FAST_SUBSET]
    rows = mutate.summarize(mutate.run(exercises, jobs=1, timeout=20, progress=False), exercises)
    for row in rows:
        assert row["kill_rate"] >= 0.95, row


def test_a_survivor_is_reported_as_survived(monkeypatch):
    """The runner can say 'survived': grade the reference itself as its own 'mutant'."""
    exercise = BY_ADAPTER["slot_mapping"]
    source = mutate.reference_path(exercise).read_text()
    status, detail, _ = mutate._evaluate((exercise.adapter, source, 20))
    assert status == "survived", detail
    broken = source + "\n\ndef slot_mapping(block_table, page_size, start, count):\n    return [0] * count\n"
    status, detail, _ = mutate._evaluate((exercise.adapter, broken, 20))
    assert status == "killed" and detail


def test_a_mutant_that_kills_its_process_counts_as_killed(monkeypatch):
    """A mutant that takes its process down (a Triton kernel writing out of bounds can) is killed,
    and the run goes on, instead of waiting forever for a dead worker."""
    exercise = BY_ADAPTER["slot_mapping"]
    dies = (mutate.reference_path(exercise).read_text()
            + "\n\ndef slot_mapping(block_table, page_size, start, count):\n    import os\n    os._exit(3)\n")
    fake = mutate.Mutant(exercise.adapter, "test", 0, 1, "the reference", "os._exit(3)")
    monkeypatch.setattr(mutate, "generate", lambda e: [(fake, dies)])
    [outcome] = mutate.run([exercise], jobs=1, timeout=20, progress=False)
    assert outcome.status == "killed" and "died" in outcome.detail, outcome


def test_the_json_report_gives_each_mutant_its_key(monkeypatch, tmp_path, capsys):
    """A survivor's key, the name its equivalence note must use, is in the --json report as well as in
    the printed line (a maintainer scripting the notes reads it there)."""
    import json

    exercise = BY_ADAPTER["slot_mapping"]
    survivor = mutate.Mutant(exercise.adapter, "test", 0, 1, "the reference", "the reference")
    monkeypatch.setattr(mutate, "generate", lambda e: [(survivor, mutate.reference_path(e).read_text())])
    report = tmp_path / "m.json"
    mutate.main(mutate.build_parser().parse_args(["--exercise", "slot_mapping", "--json", str(report), "--jobs", "1"]))
    [entry] = json.loads(report.read_text())["mutants"]
    assert entry["status"] == "survived" and entry["key"] == survivor.key
    assert f"key={survivor.key!r}" in capsys.readouterr().out
