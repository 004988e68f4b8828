"""The shipped tiny model and its tasks: it loads, it has the contract's shape, it answers."""
from __future__ import annotations

import random

import pytest
import torch

from course_lib.model.tasks import (
    TASK_KINDS,
    answer_length_stats,
    evaluate,
    heldout_set,
    is_held_out,
    sample_task,
    spell_number,
    task_kind,
)
from course_lib.model.tiny import TINY_DIR, load_tiny

# Measured (docs/tiny_model.md): 99.5-100% on every task but spell (97.8%), 99.6% overall.
# This test asks up to 100 held-out prompts per task (spell has only 93 held-out numbers,
# repeat 53 prompts, countdown all 43) and allows a few points of slack.
MIN_ACCURACY = {"max": 0.95, "reverse": 0.95, "sort": 0.95, "spell": 0.92, "repeat": 0.95, "countdown": 0.95}
MIN_OVERALL = 0.96


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


# ---------------------------------------------------------------------- tasks
def test_tasks_are_reproducible():
    a = [sample_task(random.Random(7)) for _ in range(3)]
    b = [sample_task(random.Random(7)) for _ in range(3)]
    assert a == b
    rng1, rng2 = random.Random(3), random.Random(3)
    assert [sample_task(rng1) for _ in range(20)] == [sample_task(rng2) for _ in range(20)]


@pytest.mark.parametrize("kind", TASK_KINDS)
def test_every_kind_answers_correctly(kind):
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = sample_task(rng, kind)
        assert task_kind(prompt) == kind
        arg = prompt.split(": ", 1)[1]
        if kind == "max":
            assert answer == max(arg)
        elif kind == "reverse":
            assert answer == arg[::-1]
        elif kind == "sort":
            assert answer == "".join(sorted(arg))
        elif kind == "spell":
            assert answer == spell_number(int(arg))
        elif kind == "repeat":
            ch, n = arg.split()
            assert answer == ch * int(n)
        elif kind == "countdown":
            assert answer.split() == [str(i) for i in range(int(arg), -1, -1)]


def test_spell_number():
    assert spell_number(0) == "zero"
    assert spell_number(13) == "thirteen"
    assert spell_number(40) == "forty"
    assert spell_number(100) == "one hundred"
    assert spell_number(342) == "three hundred forty two"
    assert spell_number(905) == "nine hundred five"
    with pytest.raises(ValueError, match="0..999"):
        spell_number(1000)


def test_splits_are_disjoint():
    rng = random.Random(1)
    for kind in TASK_KINDS:
        assert not any(is_held_out(sample_task(rng, kind, split="train")[0]) for _ in range(300))
        if kind != "countdown":  # 43 prompts in all: nothing held out, train and evaluate on all
            assert all(is_held_out(sample_task(rng, kind, split="heldout")[0]) for _ in range(30))
    assert not any(is_held_out(f"countdown: {n}") for n in range(43))


def test_heldout_set_sizes():
    examples = heldout_set(1000, seed=0)
    sizes = {k: sum(e[0] == k for e in examples) for k in TASK_KINDS}
    assert sizes == {"max": 1000, "reverse": 1000, "sort": 1000, "spell": 93, "repeat": 53, "countdown": 43}
    assert len({p for _, p, _ in examples}) == len(examples)
    assert all(is_held_out(p) for k, p, _ in examples if k != "countdown")


def test_bad_kind_and_split():
    with pytest.raises(ValueError, match="unknown task kind 'add'"):
        sample_task(random.Random(0), "add")
    with pytest.raises(ValueError, match="split"):
        sample_task(random.Random(0), "max", split="test")


def test_answer_lengths_span_one_to_over_a_hundred_and_fit_the_model(tiny):
    model, tok = tiny
    examples = heldout_set(200, seed=0)
    stats = answer_length_stats(examples)
    assert min(s["min"] for s in stats.values()) == 1
    assert max(s["max"] for s in stats.values()) >= 100
    longest = max(len(tok.encode_prompt(p)) + len(a) + 1 for _, p, a in examples)
    assert longest <= 160 <= model.config.max_position_embeddings


# ---------------------------------------------------------------------- the model
def test_files_and_size():
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (TINY_DIR / name).is_file()
    assert (TINY_DIR / "model.safetensors").stat().st_size <= 10 * 1024 * 1024


def test_config_contract(tiny):
    model, tok = tiny
    cfg = model.config
    for field in ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
        assert isinstance(getattr(cfg, field), int)
    assert cfg.vocab_size == tok.vocab_size
    assert cfg.num_kv_heads < cfg.num_heads  # grouped-query attention, so the course exercises it
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert not model.training
    assert model.dtype == torch.float32


def test_known_answers(tiny):
    model, tok = tiny
    for prompt, answer in [
        ("max: 38152", "8"),
        ("reverse: 58213", "31285"),
        ("sort: 93127", "12379"),
        ("spell: 342", "three hundred forty two"),
        ("repeat: x 17", "x" * 17),
        ("countdown: 12", "12 11 10 9 8 7 6 5 4 3 2 1 0"),
    ]:
        out = model.generate(tok.encode_prompt(prompt), 60, stop_token_ids=[tok.eos_token_id])
        assert out[-1] == tok.eos_token_id
        assert tok.decode(out) == answer


def test_float64_matches_float32(tiny):
    model, tok = tiny
    m64 = load_tiny(dtype=torch.float64)[0]
    assert m64.dtype == torch.float64
    seqs = [tok.encode_prompt(p) for p in ("countdown: 12", "reverse: serving")]
    for a, b in zip(model.dense_logits(seqs), m64.dense_logits(seqs)):
        assert b.dtype == torch.float64
        assert torch.allclose(a.double(), b, atol=1e-3)
    prompt = tok.encode_prompt("countdown: 12")
    assert m64.generate(prompt, 40) == model.generate(prompt, 40)


def test_evaluate_agrees_with_greedy_generate(tiny):
    """evaluate() scores by teacher forcing; that must equal running model.generate."""
    model, tok = tiny
    acc, rows = evaluate(model, tok, n_per_task=3, seed=5, return_examples=True)
    for kind, prompt, expected, got in rows:
        out = model.generate(tok.encode_prompt(prompt), 160, stop_token_ids=[tok.eos_token_id])
        greedy_ok = out[-1] == tok.eos_token_id and tok.decode(out, skip_special=False)[: -len("<eos>")] == expected
        assert greedy_ok == (expected == got), (kind, prompt, expected, tok.decode(out))
    for kind in TASK_KINDS:
        hits = sum(r[3] == r[2] for r in rows if r[0] == kind)
        assert acc[kind] == hits / 3


def test_evaluate_scores_a_broken_model_zero(tiny):
    """A check that cannot fail is a defect: a model that always says <pad> gets nothing right."""
    import copy

    model, tok = tiny
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.zero_()
        broken.lm_head.weight[tok.pad_token_id] = 1.0
    acc = evaluate(broken, tok, n_per_task=5, seed=0)
    assert acc == {k: 0.0 for k in TASK_KINDS}


def test_heldout_accuracy(tiny):
    model, tok = tiny
    acc = evaluate(model, tok, n_per_task=100, seed=12345)
    report = ", ".join(f"{k} {v:.2f}" for k, v in acc.items())
    for kind, floor in MIN_ACCURACY.items():
        assert acc[kind] >= floor, f"{kind}: {acc[kind]:.2f} < {floor} ({report})"
    assert sum(acc.values()) / len(acc) >= MIN_OVERALL, report
