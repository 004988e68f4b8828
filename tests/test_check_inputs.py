"""Credit needs the student's own computation: a wrong answer cannot pass by changing what the check
handed it (issue 23, "grader inputs tampered with").

Each case below is a realistic wrong answer plus a change to the check's inputs, written so that a
check computing its expected value afterwards from those same objects would agree with it: a list
argument swapped for objects of the student's own class, a scheduler output's page tables padded, a
cache's NaN garbage overwritten in place, a request made to look finished, arrival times rewritten,
records relabelled, a policy's `kv` given another `num_pages_needed`, the check's own forward-pass
counter called by hand, a failure of the check caught and ignored. Each is graded as a submission is
(recorded through the membrane in this process, then replayed against the grader's own check: the
verdict), and each must fail with a message that names the rule it breaks. Kernel-free.

Against the checks before the fix (git HEAD's autograder, recorded and replayed the same way) the
scheduler, block pool, watermark, budget sweep, flat batch, latency summary, vectorised attention,
closed loop, pad_batch and cached-generation cases passed on every graded seed, in the kernel and on
replay. Two are here for the rule, not the hole: kv_bytes_per_token's old check already computed its
expected value before the call (setting `config.num_layers = 0` only garbled its message; now the copy
is handed over and the change is named), and page_keys' key objects equal to everything already
failed (now refused as keys that are not plain data, before any comparison).

Implementations built on an autograder module (a mutant, a reference) use a copy of it loaded from
outside the autograder, as a student's own code would be (otherwise the check refuses them as the
autograder's reference before anything else).
"""
from __future__ import annotations

import random

import pytest
from attack_cases.credit import LOOP_ALL_AT_ONCE, SUMMARY_COUNTING_FAILED
from check_support import student_copy_fixture
import torch

from autograder import record
from autograder.checks import get_check
from autograder.replay import read_records, replay



student_copy = student_copy_fixture("tampering")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """`graded(exercise, impl, seed)`: the replayed verdict (passed, message) of one check call recorded in
    this process, as the sandbox records it; `check=` grades with another check function (the tests of
    the old checks, see the report of issue 23)."""
    folder = tmp_path_factory.mktemp("records")
    count = [0]

    def run(exercise, impl, seed=0, check=None):
        check = check or get_check(exercise)
        count[0] += 1
        path = folder / f"{count[0]}-{exercise}.jsonl"
        record.start(str(path))
        try:
            check(impl, seed=seed)
        except AssertionError:
            pass
        finally:
            record.SESSION = None
        entries, problems = read_records(path)
        assert not problems and len(entries) == 1, problems
        return replay(check, entries[0])

    return run


# ---------------------------------------------------------------------------------------------
# The tampering implementations (student code: they live in this file, outside the autograder)
# ---------------------------------------------------------------------------------------------


def kv_bytes_zero_layers(config, bytes_per_elem):
    """0 bytes, after telling the config it has no layers (2 x 0 x ... = 0)."""
    config.num_layers = 0
    return 0


class _EqualToAnything(list):
    """A list that says it equals whatever it is compared with."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None


def pad_batch_on_the_right(prompts, pad_id):
    """Right padding and an all-True mask, after swapping each prompt in the check's list for one that is
    already right-padded (so it needs no padding) and claims to equal the original."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("pad_batch needs non-empty prompts")
    width = max(len(p) for p in prompts)
    rows = [list(p) + [pad_id] * (width - len(p)) for p in prompts]
    prompts[:] = [_EqualToAnything(row) for row in rows]
    return torch.tensor(rows, dtype=torch.long), torch.ones(len(rows), width, dtype=torch.bool)


def cached_generate_without_a_cache(model, prompts, max_tokens, eos_id):
    """The no-cache loop (the whole rectangle every pass), with the check's forward-pass counter taken
    off the model and then called by hand with the pass sizes a KV cache would have had."""
    from course_lib.course import padded_forward

    hooks = model.embed_tokens._forward_pre_hooks
    counter = next(iter(hooks.values()))
    hooks.clear()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    outputs, done = [[] for _ in prompts], [False] * len(prompts)
    for _ in range(max_tokens):
        tokens = padded_forward(model, ids, mask)[:, -1].argmax(dim=-1).tolist()
        for row, token in enumerate(tokens):
            if not done[row]:
                outputs[row].append(token)
                done[row] = token == eos_id
        if all(done):
            break
        column = [[pad if d else t] for t, d in zip(tokens, done)]
        ids = torch.cat([ids, torch.tensor(column, dtype=torch.long)], dim=1)
        mask = torch.cat([mask, torch.tensor([[not d] for d in done])], dim=1)
    steps = max(len(o) for o in outputs)
    for k in range(steps):  # what a cached loop feeds: the padded prompts, then one token per row
        counter(model.embed_tokens, (torch.zeros(len(prompts) * (width if k == 0 else 1), dtype=torch.long),))
    return outputs


def occupancy_right(step_stats, max_num_seqs):
    """(Not tampering: a correct mean_batch_occupancy, to show the checks still pass honest numpy floats.)"""
    import numpy as np

    durations = np.array([s.end_time - s.start_time for s in step_stats], dtype=float)
    if not len(durations):
        return 0.0
    if durations.sum() == 0:
        durations = np.ones_like(durations)
    return np.average([s.num_running / max_num_seqs for s in step_stats], weights=durations)  # a numpy float


def sweep_all_at_once_with_arrivals_zeroed(budgets, specs, make_engine, submit):
    """Every request submitted at t=0 (wrong: before it arrives), after setting every spec's arrival time to 0."""
    import numpy as np

    for spec in specs:
        spec.arrival_time = 0.0
    rows = []
    for budget in budgets:
        engine = make_engine(budget)
        times = {}
        for spec in specs:
            submit(engine, spec)
            times[spec.request_id] = [0.0]
        while engine.has_unfinished_requests:
            for out in engine.step():
                times[out.request_id] += [engine.clock.now()] * len(out.new_token_ids)
        ttft = [t[1] - t[0] for t in times.values()]
        gaps = [b - a for t in times.values() for a, b in zip(t[1:], t[2:])]
        rows.append({"budget": budget, "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)),
                     "ttft_p99_ms": 1e3 * float(np.percentile(ttft, 99)),
                     "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)),
                     "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99))})
    return rows


def _defined_here(source: str, name: str):
    """A wrong answer the attack batch hands in as a notebook cell (tests/attack_cases/credit.py), defined
    in this file's name, as a student's function of this module is (its code is the student's)."""
    import numpy as np

    namespace = {"__name__": __name__, "np": np, "random": random}
    exec(compile(source, __file__, "exec"), namespace)
    return namespace[name]


# Failed and aborted requests counted as completed (wrong), after relabelling them 'length'.
summary_counting_failed_requests = _defined_here(SUMMARY_COUNTING_FAILED, "latency_summary")
# Every request sent at the start (an open loop, wrong), then each request's arrival time rewritten
# to when a closed loop would have sent it.
closed_loop_all_at_once_arrivals_rewritten = _defined_here(LOOP_ALL_AT_ONCE, "run_closed_loop")


class _AnyKey:
    """A key object of the student's own class that equals every other key (no key ever differs)."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def page_keys_all_equal(token_ids, page_size):
    return [_AnyKey() for _ in range(len(token_ids) // page_size)]


class WatermarkStrictlyAboveWithItsOwnNeed:
    """Admits only strictly above the watermark (wrong at the boundary, where >= admits), and there
    hands the kv manager a num_pages_needed one page larger, so that the definition says no too."""

    def __init__(self, watermark):
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.watermark = watermark
        self.patched = None

    def can_admit(self, request, num_new_tokens, cached_pages, kv, running):
        if self.patched is not None:  # undo the last call's change (the engine keeps using this kv)
            del self.patched.num_pages_needed
            self.patched = None
        need = kv.num_pages_needed(request, num_new_tokens, cached_pages)
        left = kv.num_free_pages - need
        keep = self.watermark * kv.num_pages
        if left == keep:  # the boundary: strictly above says no; make the definition say no as well
            kv.num_pages_needed = lambda *args, **kwargs: need + 1
            self.patched = kv
        return left > keep


# ---------------------------------------------------------------------------------------------
# Built on copies of the autograder's own modules (a mutant, the reference), as a student would write them
# ---------------------------------------------------------------------------------------------


def scheduler_faking_the_big_prompt(student_copy):
    """nb02's BigPromptWaitsForever (with chunking off, a prompt bigger than the budget never runs), which
    makes that prompt look finished after each step: out of the queue, status FINISHED, max_tokens tokens."""
    from course_lib.scheduler.request import RequestStatus

    base = student_copy("mutants", "nb02_continuous_batching").BigPromptWaitsForever

    class FakesTheBigPrompt(base):
        def update(self, out, sampled):
            finished = super().update(out, sampled)
            if not self.enable_chunked_prefill:
                for request in [r for r in self.waiting if r.num_tokens > self.max_num_batched_tokens]:
                    self.waiting.remove(request)
                    request.output_token_ids.extend([3] * (request.sampling_params.max_tokens - 1) + [2])
                    request.status = RequestStatus.FINISHED
            return finished

    return FakesTheBigPrompt


def pool_evicting_every_page(student_copy):
    """The reference pool, which also calls on_evict for every page it hands out (wrong: only cached pages
    are evicted), and ignores the failure that the check's hook raises for the uncached ones."""
    base = student_copy("reference", "nb03_paged_kv").StudentBlockPool

    class EvictsEveryPage(base):
        def allocate(self, n):
            pages = super().allocate(n)
            for page in pages:
                if self.on_evict is not None:
                    try:
                        self.on_evict(page)
                    except Exception:  # noqa: BLE001 - the check said no: carry on
                        pass
            return pages

    return EvictsEveryPage


def builder_padding_tables_with_their_last_page(student_copy):
    """The reference builder, which pads block tables with each sequence's last page instead of 0 (wrong),
    after padding the scheduler output's own page_ids that way (so that they need no padding)."""
    build = student_copy("reference", "nb03_paged_kv").build_flat_batch

    def build_flat_batch(output, page_size, device="cpu", pad_slot=0):
        width = max([1] + [len(s.page_ids) for s in output.scheduled])
        for s in output.scheduled:
            pages = list(s.page_ids)
            s.page_ids = type(s.page_ids)(pages + [pages[-1]] * (width - len(pages)))
        return build(output, page_size, device, pad_slot)

    return build_flat_batch


def attention_reading_garbage_values(student_copy):
    """Vectorised attention that masks the scores but multiplies the unowned slots' values by their zero
    weights (wrong: 0 * NaN = NaN), after overwriting the caches' NaN/inf garbage in place (nan_to_num_)."""
    def paged_attention_vectorized(q, k_cache, v_cache, block_tables, seq_lens, scale):
        k_cache.nan_to_num_()
        v_cache.nan_to_num_()
        num_seqs, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        tables = block_tables.long()
        k = k_cache[tables].reshape(num_seqs, -1, num_kv_heads, head_dim)  # every page of every table
        v = v_cache[tables].reshape(num_seqs, -1, num_kv_heads, head_dim)
        group = num_heads // num_kv_heads
        k = k.repeat_interleave(group, dim=2).to(torch.float64)
        v = v.repeat_interleave(group, dim=2).to(torch.float64)
        scores = torch.einsum("shd,snhd->shn", q.to(torch.float64), k) * scale
        owned = torch.arange(k.shape[1])[None, :] < seq_lens.long()[:, None]
        scores = scores.masked_fill(~owned[:, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.einsum("shn,snhd->shd", weights, v).to(q.dtype)

    return paged_attention_vectorized


# exercise -> (how to build the implementation, the words its failure must contain)
CASES = {
    "kv_bytes_per_token": (lambda copy: kv_bytes_zero_layers, "changed the check's input `config`"),
    "pad_batch": (lambda copy: pad_batch_on_the_right, "changed the check's input `prompts`"),
    "static_generate_cached": (lambda copy: cached_generate_without_a_cache,
                               "called the check's counter of forward passes"),  # (see REPLAY_WORDS)
    "StudentScheduler": (scheduler_faking_the_big_prompt, "a request's tokens come only from the engine's steps"),
    "budget_sweep": (lambda copy: sweep_all_at_once_with_arrivals_zeroed, "entered the engine at"),
    "StudentBlockPool": (pool_evicting_every_page, "your code caught this failure of the check"),
    "build_flat_batch": (builder_padding_tables_with_their_last_page, "changed the check's input `output`"),
    "paged_attention_vectorized": (attention_reading_garbage_values, "changed the check's input `k_cache`"),
    "latency_summary": (lambda copy: summary_counting_failed_requests, "changed the check's input `records["),
    "run_closed_loop": (lambda copy: closed_loop_all_at_once_arrivals_rewritten, "this is a closed loop"),
    "page_keys": (lambda copy: page_keys_all_equal, "a key must be plain data"),
    "StudentWatermark": (lambda copy: WatermarkStrictlyAboveWithItsOwnNeed, "changed the check's input `kv`"),
}


# Through the membrane the forward-pass counter cannot even be reached: the grader does not hand over
# the hooks' dict views (autograder.callbacks), and the hook ids differ between the two runs.
REPLAY_WORDS = {"static_generate_cached": ("called the check's counter of forward passes", "does not hand over")}


@pytest.mark.parametrize("exercise", sorted(CASES))
def test_a_tampering_answer_fails_on_replay_naming_the_rule(exercise, student_copy, graded):
    build, words = CASES[exercise]
    passed, message = graded(exercise, build(student_copy))
    assert not passed, f"{exercise}: the tampering answer passed"
    assert any(w in message for w in REPLAY_WORDS.get(exercise, (words,))), message
    assert "does not answer" not in message, f"it should fail the check itself, not diverge: {message}"


@pytest.mark.parametrize("exercise", sorted(CASES))
def test_a_tampering_answer_fails_without_the_membrane_too(exercise, student_copy):
    """The same verdict when the check runs directly on the student's objects (a notebook without the grader)."""
    build, words = CASES[exercise]
    with pytest.raises(AssertionError) as info:
        get_check(exercise)(build(student_copy), 0, _allow_reference=True)
    assert words in str(info.value), str(info.value)


def test_plain_numbers_of_numpy_still_count(graded):
    """Exact types refuse the student's own objects, not numpy's: a correct answer as a numpy float passes."""
    assert graded("mean_batch_occupancy", occupancy_right) == (True, "")
