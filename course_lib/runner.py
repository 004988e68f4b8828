"""Runners turn a SchedulerOutput into one new token per sampling request. They read nothing
but the SchedulerOutput: no request, no KV manager.

`ModelRunner` owns the K/V tensors, builds one flat batch (runner_batch.py: token ids,
positions, slot mapping, block tables, sequence lengths, query start offsets) and runs the
real model over it; attention writes and reads the K/V through the slots and block tables.
Two ways to run that forward pass (`EngineConfig.forward`): "eager", the PyTorch model of
transformer.py with `PagedAttend` as its attention, and, on CPUs, "cpu", the same step in one
C call (model/cpu_forward.py), which "auto" prefers where it applies.
`ScriptedRunner` computes nothing: each request ends at the length its workload scripted, so
thousands of requests simulate in seconds.

While the engine profiles its steps (`LLMEngine.profile_steps`), `ModelRunner.execute` adds its
forward and sample times, and attention's share of an eager forward, to the engine's `StepProfile`.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from time import perf_counter_ns

import torch

from .attention import default_backend, paged_decode, paged_prefill, write_kv
from .attention.torch_paged import paged_decode_torch, paged_prefill_torch, plan_decode, plan_prefill
from .runner_batch import build_flat_batch
from .sampler import sample, token_logprobs
from .spec.verify import target_tokens
from .scheduler.output import SampledTokens, SchedulerOutput


class PagedAttend:
    """The model's `attend` for one step: store the new K/V, then attend over the pages.
    Decode rows come first in the batch and may use a different (e.g. a student's) function.

    Everything that depends only on the step, not the layer, is done once: the decode / prefill
    slices of the metadata, and, for backends that offer it (`fn.make_plan`), the plan of which
    slots each query reads."""

    def __init__(self, k_caches, v_caches, meta: dict, decode_fn, prefill_fn, scale: float):
        self.k_caches, self.v_caches = k_caches, v_caches
        self.slot_mapping, self.scale = meta["slot_mapping"], scale
        d, bt, lens = meta["num_decodes"], meta["block_tables"], meta["seq_lens"]
        self.num_decodes, self.all_decodes = d, d == len(lens)
        self.decode = _PlannedCall(decode_fn, (bt[:d], lens[:d]), scale)
        self.prefill = _PlannedCall(prefill_fn, (bt[d:], meta["query_start_loc"][d:] - d, lens[d:]), scale)

    def __call__(self, layer, q, k, v):
        kc, vc, d = self.k_caches[layer], self.v_caches[layer], self.num_decodes
        write_kv(kc, vc, k, v, self.slot_mapping, may_skip=False)  # padding rows use the scratch page
        if self.all_decodes:
            return self.decode(q, kc, vc)
        if d == 0:
            return self.prefill(q, kc, vc)
        return torch.cat([self.decode(q[:d], kc, vc), self.prefill(q[d:], kc, vc)])


class _TimedAttend:
    """A `PagedAttend` whose calls (K/V writes and attention, every layer) add up into the step
    profile's `attention`: what the runner hands the model only while profiling."""

    def __init__(self, attend: PagedAttend, profile, clock):
        self.attend, self.profile, self.clock = attend, profile, clock

    def __call__(self, layer, q, k, v):
        t = self.clock()
        out = self.attend(layer, q, k, v)
        self.profile.add("attention", self.clock() - t)
        return out


class _PlannedCall:
    """`fn(q, k_cache, v_cache, *args, scale)` for every layer of one step, with the backend's
    per-step plan (if it has one) made at the first layer and reused by the others."""

    def __init__(self, fn, args: tuple, scale: float):
        self.fn, self.args, self.scale = fn, args, scale
        self.make_plan = getattr(fn, "make_plan", None)
        self.plan = None

    def __call__(self, q, kc, vc):
        if self.make_plan is None:
            return self.fn(q, kc, vc, *self.args, self.scale)
        if self.plan is None:
            self.plan = self.make_plan(kc, *self.args)
        return self.fn(q, kc, vc, *self.args, self.scale, plan=self.plan)


def backend_functions(backend: str, device, dtype: torch.dtype | None = None):
    """(decode_fn, prefill_fn) with the paged_decode / paged_prefill signatures (minus `backend`).
    The torch and cpu backends' also take a per-step `plan=` and say how to make one (`make_plan`).
    "auto" resolves with `default_backend(device, dtype)`; `resolve_backend` says to what."""
    backend = resolve_backend(backend, device, dtype)
    if backend == "cpu":  # the C kernel decodes; prefill stays torch's
        from .attention.cpu_decode import paged_decode_cpu, plan_decode_cpu

        return _with_plan(paged_decode_cpu, plan_decode_cpu), _with_plan(paged_prefill_torch, plan_prefill)
    if backend == "torch":
        return _with_plan(paged_decode_torch, plan_decode), _with_plan(paged_prefill_torch, plan_prefill)

    def decode_fn(q, kc, vc, bt, lens, scale):
        return paged_decode(q, kc, vc, bt, lens, scale, backend=backend)

    def prefill_fn(q, kc, vc, bt, qsl, lens, scale):
        return paged_prefill(q, kc, vc, bt, qsl, lens, scale, backend=backend)

    return decode_fn, prefill_fn


def _with_plan(fn, make_plan):
    """`fn` (which takes a per-step `plan=`) with `make_plan` attached for `_PlannedCall`; a new
    function each time, so the backend's own function is never marked."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    call.make_plan = make_plan
    return call


def resolve_backend(backend: str, device, dtype: torch.dtype | None = None) -> str:
    return default_backend(device, dtype) if backend == "auto" else backend


def resolve_forward(forward: str, attention_backend: str, dtype: torch.dtype, custom_attention: bool = False) -> str:
    """"eager" (the PyTorch model, attention through PagedAttend) or "cpu" (the whole step in C,
    model/cpu_forward.py). "auto" takes the C step where the "cpu" attention backend runs (a CPU,
    float32/float64, a compiler) and this PyTorch exports its BLAS; a custom attention function
    always gets the PyTorch model, which is where it plugs in. `attention_backend` is resolved."""
    from .model.cpu_forward import available

    if forward == "eager" or (forward == "auto" and (custom_attention or attention_backend != "cpu"
                                                     or not available(dtype)[0])):
        return "eager"
    if custom_attention:
        raise ValueError("forward='cpu' computes attention itself: it cannot use a custom attention function "
                         "(use forward='eager')")
    if attention_backend != "cpu":
        raise ValueError(f"forward='cpu' attends with the cpu kernel, but the attention backend is "
                         f"{attention_backend!r} (use forward='eager', or attention_backend 'cpu'/'auto')")
    return "cpu"


# With forward "auto", a step whose prefill chunks need more attention work than this (query x
# visible token pairs x heads x head_dim multiply-adds) runs eagerly: the C forward attends row by
# row, which for long prompts is ~1.2-1.5x slower than torch's batched products (a 512-token
# chunk of a 1,500-token prompt, 8 heads of 64: measured in docs/engine_benchmark.md), while
# the dispatch time it saves is ~1-2 ms a step. The tiny model's prefill steps stay far below.
EAGER_PREFILL_WORK = 2**24


class ModelRunner:
    """Runs the real model over one SchedulerOutput. Owns the K/V storage: per layer a pair of
    tensors `[num_pages + 1, page_size, num_kv_heads, head_dim]`, indexed by the pool's page ids;
    the extra last page is a scratch page that padding rows (static batching) write to.

    Parallel sampling: it copies `out.page_copies` (copy on write) before the forward pass, and
    samples each entry's `forks` from that entry's logits row, each with its own generator."""

    supports_forks = True  # the engine serves n > 1 only with a runner that says so
    verifies_drafts = True  # ... and speculative decoding only with one that returns every drafted position
    reports_logprobs = True  # ... and logprobs / best_of only with one that returns them

    def __init__(self, model, num_pages: int, page_size: int, attention="auto", seed: int = 0,
                 forward: str = "auto", batch_builder=None, verify=None):
        self.model = model
        self.device = model.device
        mc = model.config
        self.page_size, self.scratch_page = page_size, num_pages
        self.pad_slot = self.scratch_page * page_size
        shape = (num_pages + 1, page_size, mc.num_kv_heads, mc.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=model.dtype, device=self.device) for _ in range(mc.num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=model.dtype, device=self.device) for _ in range(mc.num_layers)]
        self.batch_builder = batch_builder if batch_builder is not None else build_flat_batch
        # Speculative decoding: a function like spec.verify.target_tokens (e.g. a student's) decides every
        # drafted row; without one, greedy rows take the batched argmax and sampled rows target_tokens.
        self.verify = verify
        self.scale = 1.0 / math.sqrt(mc.head_dim)
        if callable(attention):  # a paged_decode-style function from outside (e.g. a student's)
            self.attention_backend = getattr(attention, "__name__", "custom")
            self.decode_fn, self.prefill_fn = attention, backend_functions("auto", self.device, model.dtype)[1]
        else:
            self.attention_backend = resolve_backend(attention, self.device, model.dtype)
            if self.attention_backend == "cpu":  # fail now, with the reason, not in the first step
                from .attention.cpu_decode import load_kernel

                if self.device.type != "cpu":
                    raise ValueError(f"attention_backend 'cpu' needs the model on the CPU, not {self.device}")
                load_kernel(model.dtype)
            self.decode_fn, self.prefill_fn = backend_functions(self.attention_backend, self.device)
        self.forward = resolve_forward(forward, self.attention_backend, model.dtype, callable(attention))
        # "auto" (not an explicit "cpu") gives steps with long prefill chunks to the PyTorch model
        self.long_prefills_eager, self.steps_by_forward = forward == "auto", {"cpu": 0, "eager": 0}
        self.attention_width = mc.num_heads * mc.head_dim
        self.cpu_forward = None
        if self.forward == "cpu":
            from .model.cpu_forward import CpuForward

            self.cpu_forward = CpuForward(model, self.k_caches, self.v_caches)
        self.eos_token_ids = tuple(mc.eos_token_ids)  # what min_tokens holds back
        self.generator = torch.Generator(device="cpu").manual_seed(seed)  # for unseeded sampling
        self.generators: dict[str, torch.Generator] = {}  # request id -> its own, for seeded sampling
        # The engine's StepProfile while it profiles steps (LLMEngine.profile_steps), else None:
        # execute then adds its forward and sample times (and attention's share of the forward).
        self.step_profile = None

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """One forward pass over `out`; returns the sampled token of each sampling request."""
        for rid in out.finished_ids:
            self.generators.pop(rid, None)
        if out.page_copies:
            self._copy_pages(out.page_copies)
        if not out.scheduled and not out.num_padded_tokens:
            return {}
        # Single-token rows (decodes) first: the attention splits the batch there.
        scheduled = sorted(out.scheduled, key=lambda s: s.num_new_tokens > 1)
        ordered = replace(out, scheduled=scheduled)
        batch = self.batch_builder(ordered, self.page_size, self.device, self.pad_slot)
        num_decodes = out.num_padded_tokens
        prefill_pairs = 0  # (query, visible token) pairs of the prefill chunks: their attention work
        logits_rows, params, ids, histories, with_logprobs = [], [], [], [], []
        fork_rows = None  # with forks: for each sampled id, its row among logits_rows (which stay unique)
        drafted, drafted_rows = None, []  # speculative decoding: drafted entries, and all their rows
        row = out.num_padded_tokens - 1
        for s in scheduled:
            n = s.num_new_tokens
            row += n
            if n == 1:
                num_decodes += 1
            else:
                prefill_pairs += n * s.start + n * (n + 1) // 2
            if s.draft_token_ids:  # the target's logits at every one of its 1 + k positions
                if drafted is None:
                    drafted = []
                drafted.append(s)
                drafted_rows.extend(range(row - n + 1, row + 1))
                continue
            if s.samples:
                logits_rows.append(row)
                if fork_rows is not None:
                    fork_rows.append(len(logits_rows) - 1)
                params.append(s.sampling_params)
                ids.append(s.request_id)
                histories.append(s.history)
                if s.sampling_params.needs_logprobs:
                    with_logprobs.append(len(ids) - 1)
                for fork_id, fork_params in s.forks:  # a group's siblings: the same row, their own draws
                    if fork_rows is None:
                        fork_rows = list(range(len(logits_rows)))
                    fork_rows.append(len(logits_rows) - 1)
                    params.append(fork_params)
                    ids.append(fork_id)
                    histories.append(s.history)
                    if fork_params.needs_logprobs:
                        with_logprobs.append(len(ids) - 1)
        num_plain_rows = len(logits_rows)
        logits_rows = torch.tensor(logits_rows + drafted_rows, dtype=torch.long, device=self.device)
        profile = self.step_profile
        if profile is not None:
            t_forward = self._profile_clock()
        c_step = self.cpu_forward is not None and not (self.long_prefills_eager and
                                                       prefill_pairs * self.attention_width > EAGER_PREFILL_WORK)
        if c_step:
            self.steps_by_forward["cpu"] += 1
            logits = self.cpu_forward(batch.token_ids, batch.positions, batch.slot_mapping, batch.block_tables,
                                      batch.seq_lens, batch.query_start_loc, logits_rows)
        else:
            self.steps_by_forward["eager"] += 1
            meta = {"slot_mapping": batch.slot_mapping, "block_tables": batch.block_tables,
                    "seq_lens": batch.seq_lens, "query_start_loc": batch.query_start_loc, "num_decodes": num_decodes}
            attend = PagedAttend(self.k_caches, self.v_caches, meta, self.decode_fn, self.prefill_fn, self.scale)
            if profile is not None:
                attend = _TimedAttend(attend, profile, self._profile_clock)
            logits = self.model(batch.token_ids, batch.positions, attend, logits_indices=logits_rows)
        if profile is not None:
            t_sample = self._profile_clock()
            profile.add("forward", t_sample - t_forward)
            if c_step:
                profile.add("c_forward", t_sample - t_forward)
        verified = None
        if drafted is not None:
            verified = self._verify(drafted, logits[num_plain_rows:])
            logits = logits[:num_plain_rows]
        if not ids:
            if profile is not None and drafted is not None:
                profile.add("sample", self._profile_clock() - t_sample)
            return verified or {}
        if fork_rows is not None:  # a logits row for every sample
            logits = logits[torch.tensor(fork_rows, dtype=torch.long, device=logits.device)]
        tokens = sample(logits, params, [self._generator(rid, p) for rid, p in zip(ids, params)], histories,
                        self.eos_token_ids)
        if with_logprobs:
            entries = token_logprobs(logits, tokens, params, with_logprobs)
            result = SampledTokens(zip(ids, tokens), {ids[i]: entry for i, entry in zip(with_logprobs, entries)})
        else:
            result = dict(zip(ids, tokens))
        if verified:
            result.update(verified)
        if profile is not None:
            profile.add("sample", self._profile_clock() - t_sample)
        return result

    def _verify(self, drafted: list, logits: torch.Tensor) -> dict[str, list[int]]:
        """{request id: the target's token at each of its 1 + k positions} for the drafted entries,
        whose logits rows are consecutive in `logits` (spec/verify.py: greedy, or the rejection rule)."""
        verify = self.verify
        greedy = logits.argmax(dim=-1).tolist() if verify is None else None  # every greedy row at once
        result, start = {}, 0
        for s in drafted:
            n = s.num_new_tokens
            p = s.sampling_params
            if verify is not None:
                result[s.request_id] = [int(t) for t in verify(logits[start: start + n], s.draft_token_ids,
                                                               s.draft_probs, p, self._generator(s.request_id, p))]
            elif p.greedy:
                result[s.request_id] = greedy[start: start + n]
            else:
                result[s.request_id] = target_tokens(logits[start: start + n], s.draft_token_ids, s.draft_probs, p,
                                                     self._generator(s.request_id, p))
            start += n
        return result

    def _copy_pages(self, copies) -> None:
        """Copy on write: each (shared page, fresh page)'s K/V rows, in every layer, before anything is written."""
        src = torch.tensor([a for a, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([b for _, b in copies], dtype=torch.long, device=self.device)
        for cache in (*self.k_caches, *self.v_caches):
            cache[dst] = cache[src]

    def _profile_clock(self) -> int:
        """The step profile's clock (profiling only). On a GPU it first waits for the work queued so
        far: kernels run after their launch returns, and would be charged to a later phase."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return perf_counter_ns()

    def _generator(self, request_id: str, params) -> torch.Generator:
        if params.seed is None:
            return self.generator
        gen = self.generators.get(request_id)
        if gen is None:
            gen = self.generators[request_id] = torch.Generator(device="cpu").manual_seed(params.seed)
        return gen


class ScriptedRunner:
    """No model: a request emits filler tokens and then EOS at its scripted output length (set
    with `set_output_len`; its `max_tokens` if none was set). Samples of one prompt (n > 1) are
    forked like the model runner's; there is no K/V to copy, and no logprobs."""

    supports_forks = True
    verifies_drafts = True

    def __init__(self, eos_token_id: int, filler_token_id: int = 3, acceptance_rate: float = 0.7, seed: int = 0):
        self.eos_token_id, self.filler_token_id = eos_token_id, filler_token_id
        self.output_lens: dict[str, int] = {}  # request id -> the length it stops at
        self.num_emitted: dict[str, int] = {}  # request id -> tokens it has produced
        # Speculative decoding: the target "agrees" with each draft with this probability, independently
        # (drawn from a seeded generator, so a simulation is repeatable).
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be within [0, 1], got {acceptance_rate}")
        self.acceptance_rate = acceptance_rate
        self.rng = random.Random(seed)

    def set_output_len(self, request_id: str, output_len: int) -> None:
        self.output_lens[request_id] = output_len

    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        lens, emitted = self.output_lens, self.num_emitted
        for rid in out.finished_ids:
            lens.pop(rid, None)
            emitted.pop(rid, None)
        tokens = {}
        for s in out.scheduled:
            if s.draft_token_ids:
                tokens[s.request_id] = self._verify(s)
                continue
            if s.samples:
                for rid, params in ((s.request_id, s.sampling_params), *s.forks):
                    k = emitted[rid] = emitted.get(rid, 0) + 1
                    target = lens.get(rid) or params.max_tokens
                    tokens[rid] = self.eos_token_id if k >= target else self.filler_token_id
        return tokens

    def _verify(self, s) -> list[int]:
        """The scripted target's tokens at a drafted row's 1 + k positions: each draft kept with
        probability `acceptance_rate` until the first miss (a drafted EOS is always a miss), then a
        token that differs from the draft; EOS where the request reaches its scripted length."""
        rid, drafts, eos = s.request_id, s.draft_token_ids, self.eos_token_id
        k, kept = len(drafts), 0
        while kept < k and drafts[kept] != eos and self.rng.random() < self.acceptance_rate:
            kept += 1
        avoid = (eos, drafts[kept] if kept < k else eos)
        miss = next(t for t in range(self.filler_token_id, self.filler_token_id + 3) if t not in avoid)
        tokens = [*drafts[:kept], miss, *[miss] * (k - kept)]  # (past the first miss: never read)
        emitted = self.num_emitted.get(rid, 0)
        target = self.output_lens.get(rid) or s.sampling_params.max_tokens
        appended = kept + 1
        if emitted + appended >= target:  # its scripted end falls in this row: EOS there stops it
            appended = max(1, target - emitted)
            tokens[appended - 1] = eos
        self.num_emitted[rid] = emitted + appended
        return tokens
