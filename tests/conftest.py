"""Shared fixtures: small float64 models whose outputs every engine configuration must reproduce."""
from __future__ import annotations

import os
import random

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter, which must be switched on before
# anything imports triton: building a transformers model does, and test_hf_parity runs first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from course_lib.model.random_init import random_model as _random_model
from course_lib.model.transformer import Transformer

# Notebooks under tests/data are submissions the grader's tests grade, not notebooks for nbval to run.
collect_ignore_glob = ["data/*"]

# The test models are tiny: one thread is faster than two fighting over a shared 2-core machine.
torch.set_num_threads(1)


def random_model(seed: int = 0, **overrides) -> Transformer:
    """A random Llama-family model in float64 (GQA by default), no EOS so lengths are exact:
    course_lib's one random-model factory, in the tests' shape."""
    shape = dict(vocab_size=61, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=6,
                 num_kv_heads=2, max_position_embeddings=96, eos_token_id=None)
    shape.update(overrides)
    return _random_model(seed, **shape)


def random_prompts(n: int, vocab: int, lo: int = 1, hi: int = 40, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="session")
def small_model():
    return random_model(0)
