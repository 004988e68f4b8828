"""Notebook 00, `kv_bytes_per_token`: the formula on model configurations of every shape, and a wrong
answer matched to the common mistake it looks like."""
from __future__ import annotations

import random
from types import SimpleNamespace

from autograder._checking import broke, call, check, expect, expect_unchanged, forbid_calls, kind_of, pristine, show
from course_lib.model.config import ModelConfig


def _kv_cases(rng: random.Random):
    # Llama-3-8B's shape first (a number students can check by hand), then random GQA / MQA / MHA
    # shapes whose head_dim is NOT hidden_size // num_heads, so every factor is pinned down.
    cases = [(ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                          num_heads=32, num_kv_heads=8, head_dim=128), 2)]
    for kv_heads, groups in ((rng.choice([2, 3]), rng.choice([2, 4])), (1, rng.choice([4, 8])), (rng.choice([2, 4]), 1)):
        heads = kv_heads * groups
        head_dim = rng.choice([24, 40, 48])
        cases.append((ModelConfig(vocab_size=100, hidden_size=heads * 16, intermediate_size=64,
                                  num_layers=rng.randint(2, 9), num_heads=heads, num_kv_heads=kv_heads,
                                  head_dim=head_dim), rng.choice([1, 2, 4])))
    # A 405B-sized shape (exact big ints) and a bare object with only the three fields the cost depends
    # on (code that reads hidden_size or num_heads fails here), in fp8 (1 byte per number).
    cases.append((ModelConfig(vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_layers=126,
                              num_heads=128, num_kv_heads=8, head_dim=128), 2))
    cases.append((SimpleNamespace(num_layers=rng.randint(3, 40), num_kv_heads=rng.choice([1, 2, 8]),
                                  head_dim=rng.choice([64, 96, 128])), 1))
    # A made-up shape far beyond any model, whose byte count is past 2**53: a float cannot hold it
    # exactly, so a count that goes through a float (a division, a `* 1.0`) comes back wrong.
    while True:
        big = SimpleNamespace(num_layers=rng.randrange(10**6, 10**7) | 1, num_kv_heads=rng.randrange(10**3, 10**4) | 1,
                              head_dim=rng.randrange(10**4, 10**5) | 1)
        exact = 2 * big.num_layers * big.num_kv_heads * big.head_dim * 4
        if int(float(big.num_layers) * big.num_kv_heads * big.head_dim * 2 * 4) != exact:
            cases.append((big, 4))
            return cases


_KV_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size")


def _kv_known_mistake(cfg, b, got):
    """(rule, what it looks like) when `got` is what a common wrong formula gives for this shape."""
    L, kvh, hd = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    wrong = [("keys and values", "no factor 2: every token stores a key AND a value", L * kvh * hd * b),
             ("every layer", "no num_layers factor: every layer has its own cache", 2 * kvh * hd * b),
             ("bytes per number", "no bytes_per_elem factor", 2 * L * kvh * hd)]
    if hasattr(cfg, "num_heads"):
        wrong += [("kv heads only", "num_heads instead of num_kv_heads: with GQA only the KV heads are cached",
                   2 * L * cfg.num_heads * hd * b),
                  ("head_dim as given", "hidden_size instead of num_kv_heads * head_dim", 2 * L * cfg.hidden_size * b),
                  ("head_dim as given", "hidden_size // num_heads instead of head_dim",
                   2 * L * kvh * (cfg.hidden_size // cfg.num_heads) * b)]
    matches = {rule: reason for rule, reason, value in wrong if got == value and value != 2 * L * kvh * hd * b}
    if len(matches) == 1:  # (Llama's hidden_size IS num_heads x head_dim: such a value is left to the probes)
        return next(iter(matches.items()))
    return None


def _kv_broken_rule(impl, cfg, b, got) -> tuple[str, str]:
    """The rule a wrong count broke: a common mistake by its value, else by how the count moves when one
    field of the shape changes (a plain copy of the shape, one field doubled or changed at a time)."""
    known = _kv_known_mistake(cfg, b, got)
    if known:
        return known
    fields = {k: getattr(cfg, k) for k in _KV_FIELDS if hasattr(cfg, k)}

    def count(**changed):
        bytes_per_elem = changed.pop("_b", b)
        try:
            return impl(SimpleNamespace(**{**fields, **changed}), bytes_per_elem)
        except (NotImplementedError, AssertionError):
            raise
        except Exception:  # noqa: BLE001 - a probe that crashes tells nothing; the value test names a rule
            return None

    probes = []  # first the fields that must not count, then the ones that must, one at a time
    if "hidden_size" in fields:
        probes.append(("head_dim as given", "hidden_size must not change it", dict(hidden_size=3 * cfg.hidden_size), 1))
    if "num_heads" in fields:
        probes.append(("kv heads only", "num_heads (query heads) must not change it",
                       dict(num_heads=2 * cfg.num_heads), 1))
    probes += [("every layer", "doubling num_layers must double it", dict(num_layers=2 * cfg.num_layers), 2),
               ("kv heads only", "doubling num_kv_heads must double it", dict(num_kv_heads=2 * cfg.num_kv_heads), 2),
               ("head_dim as given", "doubling head_dim must double it", dict(head_dim=2 * cfg.head_dim), 2)]
    for rule, what, changed, factor in probes:
        if count(**changed) != factor * got:
            return rule, what
    if count(_b=2 * b) != 2 * got:
        return "bytes per number", "doubling bytes_per_elem must double it"
    return "keys and values", "it scales right with every field, so a constant factor is off"


def _kv_footprint_module():
    from course_lib.model import kv_footprint

    return [kv_footprint]


@check("kv_bytes_per_token")
def check_kv_bytes_per_token(impl, seed, allow_reference):
    # A function that merely calls course_lib's formula is refused (the decorator refuses the formula itself).
    with forbid_calls("kv_bytes_per_token", _kv_footprint_module(), enabled=not allow_reference):
        _kv_cases_hold(impl, seed)


def _kv_cases_hold(impl, seed):
    for cfg, b in _kv_cases(random.Random(seed)):
        # Everything the verdict reads comes from `cfg`, the check's own config: the student's code is
        # handed a copy of it (its changes to that copy are caught, and never change the expected value).
        want = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * b
        shape = ", ".join(f"{k}={getattr(cfg, k)}" for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim",
                                                              "hidden_size") if hasattr(cfg, k))
        shape += f", bytes_per_elem={b}"
        shown = (f"kv_bytes_per_token(config, {b}) for a config with only {', '.join(sorted(vars(cfg)))}"
                 if isinstance(cfg, SimpleNamespace) else f"kv_bytes_per_token(config, {b})")
        given = pristine(cfg)
        got = call(shown, impl, given, b)
        expect_unchanged(shown, "config", given, cfg, rule="inputs unchanged")
        expect(type(got) is int, lambda: f"kv_bytes_per_token must return an int (a number of bytes), got "
                                         f"{kind_of(got)} {show(got)} for {shape}", rule="an exact int")
        if got != want:
            if isinstance(cfg, SimpleNamespace) and cfg.num_layers > 10**5 and float(got) == float(want):
                broke("an exact int", f"{shown} for {shape}: expected {want} bytes, got {got}: the count went "
                                      "through a float somewhere (a division, a float factor), and a float holds "
                                      "only 53 bits: keep it in ints")
            rule, why = _kv_broken_rule(impl, cfg, b, got)
            broke(rule, f"{shown} for {shape}: expected {want} bytes, got {got} ({why})")
