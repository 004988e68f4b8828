"""Small, deterministic things the checks serve: float64 random models, prompts, clocks.

Every model is built fresh for each check call (a student's code may touch the weights) and
from its own seeded generator (the student's global RNG state is left alone). In float64 the
paged engine reproduces the dense model's greedy tokens exactly, so parity is an equality.
"""
from __future__ import annotations

import random

import torch

from course_lib.model.config import ModelConfig
# course_lib's one random-model factory, shared with the tests and the benchmarks.
from course_lib.model.random_init import SMALL_SHAPE, random_model  # noqa: F401
from course_lib.model.tokenizer import CharTokenizer

def random_prompts(rng: random.Random, n: int, vocab: int, lo: int = 1, hi: int = 20, first_id: int = 3):
    return [[rng.randrange(first_id, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@torch.inference_mode()
def greedy(model, prompts, max_tokens: int, stop_token_ids=()) -> list[list[int]]:
    """What `model.generate(p, max_tokens, stop_token_ids)` returns for each prompt, computed for
    all prompts at once (one dense forward per step instead of one per prompt and step)."""
    stop = set(stop_token_ids)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    for _ in range(max_tokens):
        if not live:
            break
        logits = model.dense_logits([seqs[i] for i in live])
        still = []
        for i, row in zip(live, logits):
            token = int(row[-1].argmax())
            outs[i].append(token)
            seqs[i].append(token)
            if token not in stop:
                still.append(i)
        live = still
    return outs


def char_model(seed: int = 0):
    """(model, tokenizer): a random float64 model over the course's character tokenizer. Its EOS
    is the tokenizer's, so answers end where the engine and `model.generate` both stop."""
    tokenizer = CharTokenizer()
    model = random_model(seed, vocab_size=tokenizer.vocab_size, max_position_embeddings=160,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():  # EOS a little less likely, so that some answers are long and some stop early
        model.lm_head.weight[tokenizer.eos_token_id] *= 0.8
    return model, tokenizer


def scripted_model_config(**overrides) -> ModelConfig:
    """A model shape without weights: the engine then uses the scripted runner (no compute), each
    request emitting filler tokens and EOS (id 2) at its `scripted_output_len` / `max_tokens`."""
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                 num_kv_heads=2, max_position_embeddings=256, eos_token_id=2)
    shape.update(overrides)
    return ModelConfig(**shape)


class StepClock:
    """A clock that advances by exactly 1 per engine step: times are step numbers, so a request
    added right after the step that finished another one arrives at that one's finish time."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def charge(self, stats) -> float:
        self.t += 1.0
        return 1.0

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)
