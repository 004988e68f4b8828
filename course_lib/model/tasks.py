"""The synthetic tasks the tiny model is trained on, and how well it does them.

Each task is a short prompt with an exact answer. The answers have very different lengths,
from one character to well over a hundred, so requests served together really do finish at
unpredictable times: that is what makes continuous batching worth having.

    max: 38152          -> 8
    reverse: 58213      -> 31285
    sort: 93127         -> 12379
    spell: 342          -> three hundred forty two
    repeat: x 7         -> xxxxxxx
    countdown: 12       -> 12 11 10 9 8 7 6 5 4 3 2 1 0

The model sees `<bos>` + prompt + "=" and answers with the characters and `<eos>`
(see `CharTokenizer.encode_prompt`).

A fixed tenth of all prompts (by a CRC of the prompt text) is held out: training never sees
them and `evaluate` only asks them, so accuracy measures generalisation, not recall. The one
exception is `countdown`: it has only 43 prompts, too few to hold any out, and it is there for
its long answers; it is trained and evaluated on all of them.
"""
from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

TASK_KINDS = ("max", "reverse", "sort", "spell", "repeat", "countdown")

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"

# Sizes, chosen so that a ~1M-parameter model learns every task in minutes on a laptop CPU
# while the answer lengths still span 1 to ~120 characters.
MAX_DIGITS = (2, 12)  # how many digits `max:` gets
SORT_DIGITS = (2, 10)  # how many distinct digits `sort:` gets
REVERSE_DIGITS = (2, 8)  # how many distinct digits `reverse:` gets
REPEAT_TIMES = (1, 20)
COUNTDOWN_FROM = (0, 42)  # "42 41 ... 0" is 118 characters
SPELL_RANGE = (0, 999)

HELD_OUT_MODULUS = 10  # one prompt in ten is held out


# ---------------------------------------------------------------------- one task each
_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spell_number(n: int) -> str:
    """0..999 in words, no "and", no hyphens: 342 -> 'three hundred forty two'."""
    if not 0 <= n <= 999:
        raise ValueError(f"spell_number handles 0..999, got {n}")
    words = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
        if n == 0:
            return " ".join(words)
    if n < 20:
        words.append(_ONES[n])
    else:
        words.append(_TENS[n // 10])
        if n % 10:
            words.append(_ONES[n % 10])
    return " ".join(words)


def _digits(rng: random.Random) -> str:
    return "".join(rng.choice(DIGITS) for _ in range(rng.randint(*MAX_DIGITS)))


def _task_max(rng):
    d = _digits(rng)
    return f"max: {d}", max(d)


def _task_reverse(rng):
    w = "".join(rng.sample(DIGITS, rng.randint(*REVERSE_DIGITS)))
    return f"reverse: {w}", w[::-1]


def _task_sort(rng):
    d = "".join(rng.sample(DIGITS, rng.randint(*SORT_DIGITS)))
    return f"sort: {d}", "".join(sorted(d))


def _spell(n):
    return f"spell: {n}", spell_number(n)


def _repeat(c, n):
    return f"repeat: {c} {n}", c * n


def _countdown(n):
    return f"countdown: {n}", " ".join(str(i) for i in range(n, -1, -1))


def _task_spell(rng):
    return _spell(rng.randint(*SPELL_RANGE))


def _task_repeat(rng):
    return _repeat(rng.choice(LETTERS), rng.randint(*REPEAT_TIMES))


def _task_countdown(rng):
    return _countdown(rng.randint(*COUNTDOWN_FROM))


_TASKS = {
    "max": _task_max,
    "reverse": _task_reverse,
    "sort": _task_sort,
    "spell": _task_spell,
    "repeat": _task_repeat,
    "countdown": _task_countdown,
}

# Kinds with few enough prompts to list them all (the others are sampled).
_ALL_PROMPTS = {
    "spell": lambda: [_spell(n) for n in range(SPELL_RANGE[0], SPELL_RANGE[1] + 1)],
    "repeat": lambda: [_repeat(c, n) for c in LETTERS for n in range(REPEAT_TIMES[0], REPEAT_TIMES[1] + 1)],
    "countdown": lambda: [_countdown(n) for n in range(COUNTDOWN_FROM[0], COUNTDOWN_FROM[1] + 1)],
}


# ---------------------------------------------------------------------- sampling and splits
NOT_HELD_OUT_KINDS = ("countdown",)  # prompt space too small to hold any out


def is_held_out(prompt: str) -> bool:
    """True for the fixed tenth of prompts that training never sees (never for countdown)."""
    if prompt.split(":", 1)[0] in NOT_HELD_OUT_KINDS:
        return False
    return zlib.crc32(prompt.encode()) % HELD_OUT_MODULUS == 0


def sample_task(rng: random.Random, kind: str | None = None, split: str | None = None) -> tuple[str, str]:
    """One (prompt, answer). `kind` None picks a kind uniformly; `split` is None (any prompt),
    "train" (never a held-out prompt) or "heldout" (only held-out prompts; for countdown,
    which holds nothing out, any prompt)."""
    if kind is None:
        kind = rng.choice(TASK_KINDS)
    if kind not in _TASKS:
        raise ValueError(f"unknown task kind {kind!r}; known kinds: {', '.join(TASK_KINDS)}")
    if split not in (None, "train", "heldout"):
        raise ValueError(f"split must be None, 'train' or 'heldout', got {split!r}")
    while True:
        prompt, answer = _TASKS[kind](rng)
        if split is None or kind in NOT_HELD_OUT_KINDS or is_held_out(prompt) == (split == "heldout"):
            return prompt, answer


def task_kind(prompt: str) -> str:
    """The kind of a prompt, from its 'kind:' prefix."""
    kind = prompt.split(":", 1)[0]
    if kind not in _TASKS:
        raise ValueError(f"prompt {prompt!r} does not start with a known task kind ({', '.join(TASK_KINDS)})")
    return kind


def heldout_set(n_per_task: int, seed: int, kinds: Sequence[str] = TASK_KINDS) -> list[tuple[str, str, str]]:
    """`n_per_task` distinct held-out (kind, prompt, answer) per kind, reproducible from `seed`;
    fewer where a kind has fewer: spell has 93 held-out numbers, repeat 53 held-out prompts,
    countdown 43 prompts in all (none held out)."""
    rng = random.Random(f"heldout-{seed}")
    out = []
    for kind in kinds:
        if kind in _ALL_PROMPTS:
            pool = [(p, a) for p, a in _ALL_PROMPTS[kind]() if kind in NOT_HELD_OUT_KINDS or is_held_out(p)]
            rng.shuffle(pool)
            out += [(kind, p, a) for p, a in pool[:n_per_task]]
            continue
        seen: dict[str, str] = {}
        for _ in range(200 * n_per_task):
            if len(seen) == n_per_task:
                break
            p, a = sample_task(rng, kind, split="heldout")
            seen.setdefault(p, a)
        out += [(kind, p, a) for p, a in seen.items()]
    return out


def answer_length_stats(examples: Sequence[tuple[str, str, str]]) -> dict[str, dict[str, int]]:
    """Per kind: min / p50 / p90 / max answer length in tokens (characters, without <eos>)."""
    by_kind: dict[str, list[int]] = {}
    for kind, _, answer in examples:
        by_kind.setdefault(kind, []).append(len(answer))
    stats = {}
    for kind, lens in by_kind.items():
        lens.sort()
        q = lambda f: lens[min(len(lens) - 1, int(f * len(lens)))]  # noqa: E731
        stats[kind] = {"min": lens[0], "p50": q(0.5), "p90": q(0.9), "max": lens[-1]}
    return stats


# ---------------------------------------------------------------------- evaluation
def evaluate(
    model,
    tokenizer,
    n_per_task: int = 50,
    seed: int = 0,
    max_tokens: int = 160,
    kinds: Sequence[str] = TASK_KINDS,
    batch_size: int = 128,
    return_examples: bool = False,
):
    """Exact-match accuracy per task kind on held-out prompts, greedy decoding.

    An answer counts only if greedy decoding emits exactly the answer's characters and then
    <eos> within `max_tokens`. That happens exactly when, fed the expected answer, the model's
    argmax at every answer position (and at <eos>) is the expected token: greedy decoding
    follows the expected path for as long as its argmax agrees. So one `dense_logits` pass per
    batch decides it, instead of one pass per generated token. With `return_examples`, also
    returns [(kind, prompt, expected, greedy output)], running `model.generate` on the misses.
    """
    examples = heldout_set(n_per_task, seed, kinds)
    eos = tokenizer.eos_token_id
    ok_by_example = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [tokenizer.encode_prompt(p) for _, p, _ in chunk]
        targets = [tokenizer.encode(a) + [eos] for _, _, a in chunk]
        logits = model.dense_logits([p + t[:-1] for p, t in zip(prompts, targets)])
        for p, t, lg in zip(prompts, targets, logits):
            pred = lg[len(p) - 1 :].argmax(-1).tolist()
            ok_by_example.append(pred == t and len(t) <= max_tokens)
    acc = {}
    for k in kinds:
        oks = [ok for (kind, _, _), ok in zip(examples, ok_by_example) if kind == k]
        acc[k] = sum(oks) / max(1, len(oks))
    if not return_examples:
        return acc
    rows = []
    for (kind, p, a), ok in zip(examples, ok_by_example):
        got = a if ok else tokenizer.decode(model.generate(tokenizer.encode_prompt(p), max_tokens, [eos]))
        rows.append((kind, p, a, got))
    return acc, rows
