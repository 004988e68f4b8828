"""Notebook 07, `StudentWatermark`: the policy on a grid of pool states, then every decision it makes
in the real engine under load."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import (broke, call, check, drive, expect, expect_greedy_answers, expect_unchanged,
                                  forbid_calls, kind_of, pristine, show)
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool
from course_lib.kv.manager import KVCacheManager
from course_lib.scheduler.request import Request


def _watermark_class():
    from course_lib.scheduler.admission import WatermarkAdmission

    return (WatermarkAdmission,)


def _admission_module():
    import course_lib.scheduler.admission as admission

    return [admission]


def _should_admit(watermark, request, n, cached, kv):
    need = kv.num_pages_needed(request, n, cached)
    return kv.num_free_pages - need >= watermark * kv.num_pages


def _describe(request, n, cached, kv, watermark):
    need = kv.num_pages_needed(request, n, cached)
    return (f"pool of {kv.num_pages} pages with {kv.num_free_pages} free, a new request whose first chunk of {n} "
            f"tokens needs {need} page(s) (page_size {kv.page_size}"
            + (f", starting from {len(cached)} cached page(s), {sum(1 for p in cached if kv.pool.ref_counts[p] == 0)} "
               "of them free and to be revived" if cached else "")
            + f"), watermark {watermark}: {kv.num_free_pages} - {need} = {kv.num_free_pages - need} free after "
              f"admitting vs {watermark} x {kv.num_pages} = {watermark * kv.num_pages:g} to keep")


def _grid(policy_cls, rng):
    """(watermark, request, n, cached, kv) states, boundary cases first."""
    states = []
    for used, watermark, n, cached_free, cached_used in [
        (10, 0.25, 20, 0, 0),   # 20 free, needs 5 -> 15 >= 5
        (11, 0.25, 16, 0, 0),   # 9 free, needs 4 -> exactly 5 left: admitted (>=)
        (12, 0.25, 16, 0, 0),   # 8 free, needs 4 -> 4 left: refused
        (14, 0.25, 4, 0, 0),    # 6 free, needs 1 -> exactly 5 left
        (6, 0.1, 9, 2, 1),      # cached pages: 2 free ones to revive, 1 in use
        (13, 0.25, 1, 2, 0),    # 7 free, 1 fresh + 2 revived -> 4 left: refused
        (10, 0.0, 37, 0, 0),    # watermark 0: anything that fits
        (0, 0.5, 1, 0, 0),
    ] + [(rng.randint(0, 16), rng.choice([0.05, 0.1, 0.2, 0.3]), rng.randint(1, 24), rng.randint(0, 2), rng.randint(0, 1))
         for _ in range(6)]:
        pool = BlockPool(20, 4)
        kv = KVCacheManager(pool, max_model_len=256)
        taken = pool.allocate(used) if used else []
        free_pages = [p for p in range(20) if pool.is_free(p)]
        cached = free_pages[-cached_free:] if cached_free else []
        cached += taken[:cached_used]
        prompt = [5] * (len(cached) * 4 + n)
        request = Request(f"req-{len(states)}", prompt, SamplingParams(max_tokens=8))
        states.append((watermark, request, n, cached, kv))
    return states


class _Judge:
    """Sits between the engine and the student's policy: compares every answer with the definition."""

    def __init__(self, policy, watermark):
        self.policy, self.watermark, self.calls = policy, watermark, 0

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        # The definition's answer first, from the engine's state as the policy is asked: the policy is
        # handed the engine's own kv manager, request and running list, and must leave them as they are.
        want = _should_admit(self.watermark, request, num_new_tokens, cached_pages, kv)
        described = _describe(request, num_new_tokens, cached_pages, kv, self.watermark)
        kept = pristine((request, kv, list(running)))
        got = call("can_admit(...)", self.policy.can_admit, request, num_new_tokens, cached_pages, kv, running)
        shown = f"StudentWatermark({self.watermark}).can_admit inside the engine"
        for what, handed, mine in zip(("request", "kv", "running"), (request, kv, list(running)), kept):
            expect_unchanged(shown, what, handed, mine, rule="only decides")
        self.calls += 1
        expect(type(got) is bool or (type(got) is int and got in (0, 1)),
               lambda: f"{shown} must return a bool, got {kind_of(got)} {show(got)}", rule="count every page")
        if bool(got) != want:
            broke("count every page",
                  f"StudentWatermark({self.watermark}) inside the engine: can_admit returned {got!r} for "
                  f"{described}; expected {want}")
        return got


@check("StudentWatermark", forbidden=_watermark_class)
def check_StudentWatermark(impl, seed, allow_reference):
    name = "StudentWatermark"
    rng = random.Random(seed)
    with forbid_calls(name, _admission_module(), enabled=not allow_reference):
        for bad in (1.0, 1.5, -0.1, float("nan"), float("inf")):
            try:
                impl(bad)
            except ValueError:
                continue
            except NotImplementedError:
                raise  # unfinished: the notebook says so, not a broken rule
            except Exception as exc:  # noqa: BLE001
                broke("a valid fraction",
                      f"{name}({bad}) must raise ValueError (a watermark is a fraction in [0, 1)), got "
                     f"{type(exc).__name__}: {exc}")
            broke("a valid fraction",
                  f"{name}({bad}) must raise ValueError: a watermark is a fraction of the pool in [0, 1)")
        for watermark, request, n, cached, kv in _grid(impl, rng):
            policy = call(f"{name}({watermark})", impl, watermark)
            # The expected answer and the message from the check's own state, before the policy sees it;
            # the policy is handed copies, which it must leave as they are.
            want = _should_admit(watermark, request, n, cached, kv)
            need = kv.num_pages_needed(request, n, cached)
            described = _describe(request, n, cached, kv, watermark)
            given_request, given_kv = pristine((request, kv))
            before = (given_kv.num_free_pages, list(given_kv.pool.ref_counts))
            got = call("can_admit", policy.can_admit, given_request, n, list(cached), given_kv, [])
            expect(type(got) is bool or (type(got) is int and got in (0, 1)),
                   lambda: f"{name}.can_admit must return a bool, got {kind_of(got)} {show(got)}", rule="count every page")
            expect((given_kv.num_free_pages, list(given_kv.pool.ref_counts)) == before,
                   f"{name}.can_admit changed the pool: it must only decide, never allocate or free", rule="only decides")
            expect_unchanged(f"{name}.can_admit", "kv", given_kv, kv, rule="only decides")
            expect_unchanged(f"{name}.can_admit", "request", given_request, request, rule="only decides")
            if bool(got) != want:
                hint = ""
                if kv.num_free_pages - need == watermark * kv.num_pages:
                    hint = " (exactly at the watermark: that is still allowed, use >=)"
                elif want is False and got:
                    hint = (" (admitting it would leave less than the watermark free: count the pages the request "
                            "needs, kv.num_pages_needed(request, num_new_tokens, cached_pages), cached pages to "
                            "revive included)")
                broke("exactly is allowed" if kv.num_free_pages - need == watermark * kv.num_pages else "count every page",
                      f"{name}.can_admit returned {got!r} for {described}; expected {want}{hint}")
        # Under load, inside the engine.
        watermark = rng.choice([0.1, 0.2, 0.3])
        judge = _Judge(impl(watermark), watermark)
        engine = LLMEngine(fixtures.scripted_model_config(),
                           EngineConfig(page_size=4, num_pages=24, max_num_seqs=8, max_num_batched_tokens=64),
                           admission=judge)
        for i in range(10):
            out_len = rng.randint(4, 20)
            engine.add_request([5] * rng.randint(6, 20), SamplingParams(max_tokens=out_len), request_id=f"r{i}",
                               scripted_output_len=out_len)
        drive(engine, f"{name}({watermark}) (10 requests, a 24-page pool)", max_steps=500)
        expect(judge.calls > 0, f"{name}: the engine never asked the policy (internal error)")
    # Real tokens through the policy.
    model = fixtures.random_model(seed)
    prompts = fixtures.random_prompts(rng, 4, model.config.vocab_size, lo=2, hi=12)
    want = fixtures.greedy(model, prompts, 6)
    engine = LLMEngine(model, EngineConfig(page_size=4, num_pages=16, max_num_seqs=4), admission=impl(0.2))
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=6), request_id=f"r{i}")
    drive(engine, f"{name}(0.2) (serving a float64 model)", max_steps=300)
    expect_greedy_answers(engine, want, lambda i, got, w: (
        f"{name}: serving a float64 model, request r{i} produced {got} instead of {w}"), rule="only decides")
