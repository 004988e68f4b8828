"""The step flows one way: a complete, plain SchedulerOutput; one place that advances a request;
a runner that reads nothing else; replaceable preemption and batch building."""
from __future__ import annotations

import copy
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from conftest import random_prompts
from course_lib import EngineConfig, LLMEngine, SamplingParams
from course_lib.kv.block_pool import BlockPool
from course_lib.kv.manager import KVCacheManager
from course_lib.kv.prefix_cache import PrefixCache
from course_lib.model.config import ModelConfig
from course_lib.runner import ModelRunner, ScriptedRunner
from course_lib.runner_batch import FlatBatch, build_flat_batch
from course_lib.scheduler.continuous import ContinuousScheduler
from course_lib.scheduler.output import ScheduledRequest, SchedulerOutput
from course_lib.scheduler.request import Request

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _recording_engine(model, **cfg):
    """An engine whose every SchedulerOutput (a deep copy, as the runner saw it) is kept."""
    engine = LLMEngine(model, EngineConfig(**{"page_size": 4, **cfg}))
    outputs, execute = [], engine.runner.execute

    def record(out):
        outputs.append(copy.deepcopy(out))
        return execute(out)

    engine.runner.execute = record
    return engine, outputs


def test_every_entry_carries_what_the_runner_needs(small_model):
    engine, outputs = _recording_engine(small_model, max_num_batched_tokens=16, enable_prefix_caching=True)
    prompts = [list(range(3, 20))] + random_prompts(5, small_model.config.vocab_size, lo=3, hi=30, seed=1)
    ids = [engine.add_request(p, SamplingParams(max_tokens=5, seed=i, temperature=0.5 * (i % 2)))
           for i, p in enumerate(prompts)]
    seen = set()
    while engine.has_unfinished_requests or len(ids) == len(prompts):
        if not engine.has_unfinished_requests:  # then one that starts with the first one's 12 tokens: a hit
            ids.append(engine.add_request(prompts[0][:12] + [5, 6], SamplingParams(max_tokens=5)))
        engine.step()
        out = outputs[-1]
        for s in out.scheduled:
            r = engine.requests[s.request_id]
            assert s.token_ids == r.all_token_ids[s.start: s.start + s.num_new_tokens]
            assert list(s.positions) == list(range(s.start, s.start + s.num_new_tokens))
            assert len(s.page_ids) * 4 >= s.start + s.num_new_tokens
            assert s.slots(4) == [s.page_ids[p // 4] * 4 + p % 4 for p in s.positions]
            assert s.sampling_params == r.sampling_params
            seen.add(s.request_id)
        assert out == copy.deepcopy(out) and "ScheduledRequest(" in repr(out)  # plain data
    assert seen == set(ids)
    # Every request's id comes back exactly once, in a later step, as gone: runners drop its state.
    gone = [rid for out in outputs for rid in out.finished_ids]
    assert gone and len(gone) == len(set(gone)) and set(gone) <= set(ids)
    for k, out in enumerate(outputs):
        later = {s.request_id for o in outputs[k:] for s in o.scheduled}
        assert not later & set(out.finished_ids), "a request ran after it was reported gone"
    assert engine.requests[ids[-1]].num_cached_tokens == 12


def test_a_runner_fed_only_the_outputs_computes_the_same_tokens(small_model):
    """A second runner that has never seen the engine's requests nor its KV manager, given the
    same SchedulerOutputs, produces the same tokens: the output is the whole contract."""
    engine, outputs = _recording_engine(small_model, num_pages=24, max_num_batched_tokens=12, admission="none")
    prompts = random_prompts(5, small_model.config.vocab_size, lo=5, hi=25, seed=2)
    results = engine.generate(prompts, [SamplingParams(max_tokens=9, temperature=0.8, seed=i) for i in range(5)])
    assert engine.scheduler.num_preemptions > 0, "the pool should have forced preemptions"
    shadow = ModelRunner(small_model, engine.pool.num_pages, engine.pool.page_size, forward="eager")
    produced: dict[str, list[int]] = {}
    for out in outputs:
        for rid, token in shadow.execute(out).items():
            produced.setdefault(rid, []).append(token)
    assert [produced[o.request_id] for o in results] == [o.token_ids for o in results]


def test_scripted_runner_needs_only_the_output():
    runner = ScriptedRunner(eos_token_id=2)
    runner.set_output_len("a", 2)
    params = SamplingParams(max_tokens=5)
    step = SchedulerOutput(scheduled=[ScheduledRequest("a", 3, 0, True, [5, 6, 7], (0,), params),
                                      ScheduledRequest("b", 3, 0, True, [5, 6, 7], (1,), params)])
    assert runner.execute(step) == {"a": 3, "b": 3}
    assert runner.execute(step) == {"a": 2, "b": 3}
    runner.execute(SchedulerOutput(finished_ids=["a", "b"]))
    assert runner.output_lens == {} and runner.num_emitted == {}


def test_num_computed_tokens_is_written_in_one_file():
    writes = re.compile(r"\.num_computed_tokens\s*(\+|-)?=(?!=)")
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "course_lib").rglob("*.py")
                   if writes.search(p.read_text()))
    assert files == ["course_lib/scheduler/base.py"]


def test_allocate_reports_the_prefix_hit_and_leaves_the_request_alone():
    pool = BlockPool(8, 2)
    cache = PrefixCache(pool)
    kv = KVCacheManager(pool, max_model_len=32, prefix_cache=cache)
    first = Request("a", [3, 4, 5, 6, 7], SamplingParams())
    assert kv.allocate(first, 5) == 0
    first.num_computed_tokens = 5  # (the scheduler's job)
    kv.commit(first)
    second = Request("b", [3, 4, 5, 6, 9], SamplingParams())
    cached = kv.lookup_prefix(second)
    assert len(cached) == 2
    assert kv.allocate(second, 1, cached) == 4
    assert second.num_computed_tokens == 0 and second.num_cached_tokens == 0
    assert kv.tables["b"].pages[:2] == tuple(cached)


def test_update_advances_and_returns_what_finished():
    engine = LLMEngine(ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
                                   num_kv_heads=1, max_position_embeddings=64, eos_token_id=2),
                       EngineConfig(page_size=4))
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=2), request_id="x")
    sched = engine.scheduler
    out = sched.next_step()
    assert [(s.request_id, s.num_new_tokens, s.samples) for s in out.scheduled] == [("x", 3, True)]
    assert sched.update(out, {"x": 9}) == []
    r = engine.requests["x"]
    assert r.num_computed_tokens == 3 and r.output_token_ids == [9]
    out = sched.next_step()
    assert out.scheduled[0].token_ids == [9] and out.scheduled[0].start == 3
    assert sched.update(out, {"x": 9}) == [r] and r.finish_reason.value == "length"
    assert engine.pool.num_free_pages == engine.pool.num_pages
    assert sched.next_step().finished_ids == ["x"]


def test_the_pool_is_bookkeeping_and_the_runner_owns_the_storage(small_model):
    pool = BlockPool(4, 2)
    assert not [v for v in vars(pool).values() if isinstance(v, (torch.Tensor, list)) and v and
                isinstance(v[0], torch.Tensor)]
    engine = LLMEngine(small_model, EngineConfig(page_size=4, num_pages=10))
    mc = small_model.config
    assert len(engine.runner.k_caches) == mc.num_layers
    # one scratch page past the pool's: static batching's padding rows write there
    assert engine.runner.k_caches[0].shape == (11, 4, mc.num_kv_heads, mc.head_dim)


def test_the_engine_does_not_import_the_simulator():
    code = "import sys, course_lib.engine; print(any(m.startswith('course_lib.sim') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "False"
    from course_lib.clock import WallClock
    from course_lib.sim.clock import WallClock as Reexported

    assert Reexported is WallClock


def test_request_carries_no_simulator_field():
    assert not hasattr(Request("a", [1], SamplingParams()), "scripted_output_len")


# --------------------------------------------------------------------------- replaceable pieces
def test_build_flat_batch_lays_out_padding_decodes_and_chunks():
    params = SamplingParams()
    out = SchedulerOutput(scheduled=[ScheduledRequest("d", 1, 5, True, [9], (3, 1), params),
                                     ScheduledRequest("p", 3, 2, False, [4, 5, 6], (0, 2), params)],
                          num_padded_tokens=1)
    b = build_flat_batch(out, page_size=4, device="cpu", pad_slot=28)
    assert isinstance(b, FlatBatch) and b.num_tokens == 5
    assert b.token_ids.tolist() == [0, 9, 4, 5, 6]
    assert b.positions.tolist() == [0, 5, 2, 3, 4]
    assert b.slot_mapping.tolist() == [28, 1 * 4 + 1, 0 * 4 + 2, 0 * 4 + 3, 2 * 4 + 0]
    assert b.block_tables.tolist() == [[7, 0], [3, 1], [0, 2]]
    assert b.seq_lens.tolist() == [1, 6, 5]
    assert b.query_start_loc.tolist() == [0, 1, 2, 5]
    assert b.block_tables.dtype == torch.int32 and b.slot_mapping.dtype == torch.long


@pytest.mark.parametrize("forward", ["eager", "cpu"])
def test_an_injected_batch_builder_drives_the_engine(small_model, forward):
    if forward == "cpu":
        from course_lib.model.cpu_forward import available

        if not available(small_model.dtype)[0]:
            pytest.skip("no C forward here")
    prompts = random_prompts(4, small_model.config.vocab_size, lo=2, hi=20, seed=3)
    want = [small_model.generate(p, 6, stop_token_ids=[]) for p in prompts]
    calls = []

    def mine(output, page_size, device, pad_slot):
        calls.append(len(output.scheduled))
        return build_flat_batch(output, page_size, device, pad_slot)

    cfg = EngineConfig(page_size=4, max_num_batched_tokens=16, forward=forward)
    got = LLMEngine(small_model, cfg, batch_builder=mine).generate(prompts, SamplingParams(max_tokens=6))
    assert [o.token_ids for o in got] == want and calls

    def shifted(output, page_size, device, pad_slot):  # writes every K/V one slot too far
        batch = build_flat_batch(output, page_size, device, pad_slot)
        batch.slot_mapping = (batch.slot_mapping + 1) % pad_slot
        return batch

    wrong = LLMEngine(small_model, cfg, batch_builder=shifted).generate(prompts, SamplingParams(max_tokens=6))
    assert [o.token_ids for o in wrong] != want, "the builder's slot_mapping must be what writes the K/V"


def test_preemption_is_overridable(small_model):
    events = []

    class MyPreemption(ContinuousScheduler):
        def choose_victim(self):
            victim = max(self.running, key=lambda r: r.admit_seq)
            events.append(("victim", victim.request_id))
            return victim

        def preempt(self, request):
            events.append(("preempt", request.request_id))
            self.running.remove(request)
            self.kv.free(request)
            request.num_computed_tokens = 0
            self.waiting.appendleft(request)

    prompts = random_prompts(5, small_model.config.vocab_size, lo=5, hi=25, seed=4)
    want = [small_model.generate(p, 8, stop_token_ids=[]) for p in prompts]
    engine = LLMEngine(small_model, EngineConfig(page_size=4, num_pages=16, admission="none"), scheduler=MyPreemption)
    got = engine.generate(prompts, SamplingParams(max_tokens=8))
    assert [o.token_ids for o in got] == want
    assert events and all(kind in ("victim", "preempt") for kind, _ in events)
    assert engine.scheduler.num_preemptions == len(events) // 2
    assert engine.pool.num_free_pages == engine.pool.num_pages


def test_a_victim_that_already_runs_this_step_is_refused(small_model):
    class OldestGoes(ContinuousScheduler):
        def choose_victim(self):
            return self.running[0]

    # Three 4-token prompts fill 3 of 5 pages; at their first decode each needs a new page, and the
    # third finds none while the oldest already runs in this step.
    engine = LLMEngine(small_model, EngineConfig(page_size=4, num_pages=5, admission="none"), scheduler=OldestGoes)
    with pytest.raises(RuntimeError, match="already runs this step"):
        engine.generate([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]], SamplingParams(max_tokens=8))
