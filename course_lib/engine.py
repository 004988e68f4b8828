"""LLMEngine: add requests, step, collect outputs.

One direction per step, no back-and-forth (`step()` is four lines):

1. schedule: `scheduler.next_step()` decides who runs and how many tokens each computes
   (making room in the KV manager, preempting if it must) and returns a `SchedulerOutput` that
   holds everything the forward pass needs;
2. execute: `runner.execute(output)` computes and samples one token per sampling request,
   reading nothing but the output;
3. update: `scheduler.update(output, sampled)` advances every scheduled request (progress,
   tokens, prefix cache, stops, freed pages) and returns those that finished;
4. record: the engine writes a `StepStats` row, lets the clock price it, stamps the requests'
   times and returns a `RequestOutput` per request that changed.

`profile_steps()` records where each step's time goes (course_lib/step_profile.py); off by default.

Injection points (so that a student's piece can serve real requests): `block_pool`
(bookkeeping only: allocate / free / share / num_free_pages / ref_counts), `scheduler` (a class
built like `ContinuousScheduler`), `admission` (an object with `can_admit`), `prefix_cache`
(an object like `PrefixCache`, built on the pool), `attention` (a function with the
`paged_decode` signature, used for decode rows), `batch_builder` (a function like
`runner_batch.build_flat_batch`), `runner`, `clock` and `verify` (speculative decoding: a function
like `spec.verify.target_tokens`, the target's token at every drafted position).

Parallel sampling (`SamplingParams(n=...)`, `best_of=`): `add_request` returns the group's id and
makes one `Request` per sample, with id "<group id>#<i>". The prompt is computed once, for sample
0; the others are forked from it when its last prompt token is computed, sharing its pages (copy
on write: kv/manager.py). `step()` returns the samples' outputs (`parent_id`, `index`);
`generate()` returns one output per prompt whose `samples` are the group's answers (with best_of,
the n of highest cumulative logprob, best first).
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from .clock import WallClock
from .engine_config import SCHEDULERS, EngineConfig
from .kv.block_pool import BlockPool
from .kv.manager import KVCacheManager
from .kv.prefix_cache import PrefixCache
from .model.config import ModelConfig
from .request_output import RequestOutput  # also public here: course_lib.engine.RequestOutput
from .runner import ModelRunner, ScriptedRunner
from .scheduler.admission import make_admission
from .scheduler.output import StepStats
from .scheduler.request import Request, sample_id
from .scheduler.sampling import SamplingParams
from .step_profile import StepProfile


def _default_num_pages(config: EngineConfig, max_model_len: int) -> int:
    return max(1, -(-config.max_num_seqs * max_model_len // (2 * config.page_size)))


class LLMEngine:
    def __init__(self, model, config: EngineConfig | None = None, *, block_pool=None, scheduler=None,
                 admission=None, prefix_cache=None, attention=None, batch_builder=None, runner=None, clock=None,
                 verify=None):
        """`model`: a course_lib Transformer, or just a `ModelConfig` to simulate with the scripted runner."""
        self.config = config = config or EngineConfig()
        self.model = None if isinstance(model, ModelConfig) else model
        self.model_config: ModelConfig = model if isinstance(model, ModelConfig) else model.config
        mc = self.model_config
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        num_pages = config.num_pages or _default_num_pages(config, self.max_model_len)
        contiguous = config.kv_layout == "contiguous"

        # Space: the pool (bookkeeping only; the model runner owns the K/V storage it indexes).
        if contiguous:
            # The same pool with pages of max_model_len slots: one reservation per request.
            total = num_pages * config.page_size
            if total < self.max_model_len:
                raise ValueError(f"a contiguous KV cache of {total} tokens cannot hold one request of "
                                 f"max_model_len={self.max_model_len} tokens")
            page_size, num_pages = self.max_model_len, total // self.max_model_len
        else:
            page_size = config.page_size
        self.pool = block_pool if block_pool is not None else BlockPool(num_pages, page_size)
        if prefix_cache is None and config.enable_prefix_caching and not contiguous:
            prefix_cache = PrefixCache(self.pool)
        self.prefix_cache = prefix_cache
        self.kv = KVCacheManager(self.pool, self.max_model_len, prefix_cache, reserve_max_len=contiguous)

        # Time: who runs each step.
        self.admission = admission if admission is not None else make_admission(config.admission, config.watermark)
        scheduler_cls = scheduler or SCHEDULERS[config.scheduler]
        self.scheduler = scheduler_cls(self.kv, self.admission, config.max_num_seqs,
                                       config.max_num_batched_tokens, config.enable_chunked_prefill,
                                       config.preemption, eos_token_ids=mc.eos_token_ids)

        # Compute.
        if runner is not None:
            self.runner = runner
        elif self.model is None:
            self.runner = ScriptedRunner(mc.eos_token_ids[0] if mc.eos_token_ids else 0,
                                         acceptance_rate=config.spec_acceptance_rate, seed=config.seed)
        else:
            backend = attention if attention is not None else config.attention_backend
            self.runner = ModelRunner(self.model, self.pool.num_pages, self.pool.page_size, attention=backend,
                                      seed=config.seed, forward=config.forward, batch_builder=batch_builder,
                                      verify=verify)

        self._draft_model = None  # a drafter that counts its own work (a draft model): priced with each step
        if config.speculative != "none":
            self._start_speculation()

        self.clock = clock if clock is not None else WallClock()
        self.requests: dict[str, Request] = {}
        self.groups: dict[str, list[Request]] = {}  # parallel sampling: group id -> its samples, in index order
        self.group_params: dict[str, SamplingParams] = {}  # ... and the group's own parameters (n, best_of)
        self.step_stats: list[StepStats] = []
        self.step_profile: StepProfile | None = None  # where each step's time goes, when asked (profile_steps)
        self._ids = itertools.count()

    # ------------------------------------------------------------------ requests in
    def add_request(self, prompt_token_ids, sampling_params: SamplingParams | None = None, request_id=None,
                    arrival_time: float | None = None, scripted_output_len: int | None = None) -> str:
        """Queue a request. Bad input raises ValueError here, before anything else is touched."""
        params = sampling_params or SamplingParams()
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while request_id in self.requests:
                request_id = f"req-{next(self._ids)}"
        request_id = str(request_id)
        self._validate(request_id, prompt_token_ids, params)
        arrival = self.clock.now() if arrival_time is None else arrival_time
        if params.num_samples > 1:
            samples = self._sample_group(request_id, list(prompt_token_ids), params, arrival)
        else:
            samples = [Request(request_id, list(prompt_token_ids), params, arrival_time=arrival)]
        if scripted_output_len is not None:  # the scripted runner's stop length (a model decides for itself)
            set_output_len = getattr(self.runner, "set_output_len", None)
            if set_output_len is not None:
                for sample in samples:
                    set_output_len(sample.request_id, scripted_output_len)
        for sample in samples:
            self.requests[sample.request_id] = sample
        self.scheduler.add(samples[0])
        return request_id

    def _sample_group(self, group_id: str, prompt: list[int], params: SamplingParams, arrival: float) -> list:
        """The requests of a group: sample i has id "<group_id>#<i>" and, with a seed, seed + i (vLLM V1's
        rule: sample 0 answers as n=1 would). Sample 0 holds the others in `forks` until its prompt is done."""
        logprobs = params.logprobs if params.logprobs is not None else (0 if params.needs_logprobs else None)
        samples = []
        for i in range(params.num_samples):
            own = replace(params, n=1, best_of=None, logprobs=logprobs,
                          seed=None if params.seed is None else params.seed + i)
            samples.append(Request(sample_id(group_id, i), prompt, own, arrival_time=arrival, parent_id=group_id,
                                   sample_index=i))
        samples[0].forks = samples[1:]
        self.groups[group_id], self.group_params[group_id] = samples, params
        return samples

    def _validate(self, request_id, prompt, params) -> None:
        if request_id in self.requests or request_id in self.groups:
            raise ValueError(f"duplicate request id {request_id!r}: ids must be unique per engine")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if len(prompt) == 0:
            raise ValueError("empty prompt: a request needs at least 1 token")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        params.check_vocab(vocab)
        if params.num_samples > 1:
            self._check_parallel_sampling(request_id, params)
        elif params.needs_logprobs and not getattr(self.runner, "reports_logprobs", False):
            raise ValueError(f"logprobs need a runner that reports them (the model runner); "
                             f"{type(self.runner).__name__} does not")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room to generate: "
                             f"max_model_len is {self.max_model_len}")
        # The worst case this request can reach must fit in the whole pool, or it could never finish.
        worst = min(len(prompt) + params.max_tokens, self.max_model_len) - 1
        if self.kv.pages_to_hold(worst) > self.pool.num_pages:
            capacity = self.pool.num_pages * self.pool.page_size
            raise ValueError(f"request needs up to {worst} KV slots (prompt {len(prompt)} + max_tokens "
                             f"{params.max_tokens}) but the whole pool holds {capacity}")

    def _check_parallel_sampling(self, request_id: str, params: SamplingParams) -> None:
        """n / best_of > 1 needs pieces that know how to fork samples; refused by name otherwise."""
        from .scheduler.continuous import ContinuousScheduler

        k, what = params.num_samples, "best_of" if params.best_of else "n"
        if k > self.config.max_num_seqs:
            raise ValueError(f"{what} = {k} samples cannot run together: the engine has max_num_seqs = "
                             f"{self.config.max_num_seqs} seats")
        if type(self.scheduler).schedule is not ContinuousScheduler.schedule:
            raise ValueError(f"{what} = {k} (parallel sampling) needs ContinuousScheduler's schedule(), which keeps "
                             f"seats for a group's samples; {type(self.scheduler).__name__} has its own")
        if self.kv.reserve_max_len:
            raise ValueError(f"{what} = {k} (parallel sampling) shares pages: it needs kv_layout 'paged', "
                             f"not 'contiguous'")
        if not getattr(self.runner, "supports_forks", False):
            raise ValueError(f"{what} = {k} (parallel sampling) needs a runner that samples forks (the model or "
                             f"scripted runner); {type(self.runner).__name__} does not")
        if params.needs_logprobs and not getattr(self.runner, "reports_logprobs", False):
            raise ValueError(f"logprobs (and best_of > n, which ranks by them) need a runner that reports them "
                             f"(the model runner); {type(self.runner).__name__} does not")
        taken = [sample_id(request_id, i) for i in range(k) if sample_id(request_id, i) in self.requests]
        if taken:
            raise ValueError(f"duplicate request id {taken[0]!r}: the samples of {request_id!r} need their ids")

    def _start_speculation(self) -> None:
        """Give the scheduler its drafter (EngineConfig.speculative), or refuse the pieces that cannot speculate."""
        from .scheduler.continuous import ContinuousScheduler
        from .spec import make_drafter

        what = f"speculative={self.config.speculative!r}"
        if type(self.scheduler).schedule is not ContinuousScheduler.schedule:
            raise ValueError(f"{what} needs ContinuousScheduler's schedule(), which schedules drafted decodes; "
                             f"{type(self.scheduler).__name__} has its own")
        if not getattr(self.runner, "verifies_drafts", False):
            raise ValueError(f"{what} needs a runner that returns the target's token at every drafted position "
                             f"(the model or scripted runner); {type(self.runner).__name__} does not")
        drafter = make_drafter(self.config.speculative, self.config.num_speculative_tokens, self.model,
                               self.config.draft_layers, self.config.seed)
        self.scheduler.drafter = drafter
        if hasattr(drafter, "take_work"):
            self._draft_model = drafter

    def abort(self, request_id) -> None:
        group = self.groups.get(str(request_id))
        if group is not None:  # a group: every sample (the unborn ones first, so none is promoted to sample 0)
            for sample in reversed(group):
                self.abort(sample.request_id)
            return
        request = self.requests.get(str(request_id))
        if request is None:
            raise ValueError(f"cannot abort unknown request id {request_id!r}")
        if request.is_finished:
            return
        self.scheduler.abort(request)
        request.finish_time = self.clock.now()

    # ------------------------------------------------------------------ one step
    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        """One scheduling decision and one forward pass. Returns the requests that changed."""
        if self.step_profile is not None:
            return self._profiled_step()
        start = self.clock.now()
        out = self.scheduler.next_step()
        sampled = self.runner.execute(out)
        finished = self.scheduler.update(out, sampled)
        return self._record(out, sampled, finished, start)

    def _profiled_step(self) -> list[RequestOutput]:
        """`step()`, the same calls in the same order, with the end of each stage marked in
        `self.step_profile` (tests/test_step_profile.py holds the two to the same calls)."""
        profile = self.step_profile
        profile.begin()
        start = self.clock.now()
        out = self.scheduler.next_step()
        profile.mark("schedule")
        sampled = self.runner.execute(out)
        profile.mark_execute()
        finished = self.scheduler.update(out, sampled)
        outputs = self._record(out, sampled, finished, start)
        profile.mark("update")
        return outputs

    def profile_steps(self, on: bool = True) -> StepProfile | None:
        """Record where each step's time goes from now on (`on=False`: stop). Returns the new
        `StepProfile`, one row per step (course_lib/step_profile.py says what each phase holds);
        a runner with a `step_profile` attribute (the model runner) records its own phases into it."""
        self.step_profile = StepProfile() if on else None
        if hasattr(self.runner, "step_profile"):
            self.runner.step_profile = self.step_profile
        return self.step_profile

    def _record(self, out, sampled: dict, finished: list[Request], start: float) -> list[RequestOutput]:
        """The step's stats (priced by the clock), the requests' timestamps, and their outputs.
        Written for speed: its loop runs for every running request every step."""
        requests = self.requests
        # Request id -> (request, tokens it produced this step).
        changed: dict[str, tuple[Request, list[int]]] = {rid: (requests[rid], []) for rid in out.failed}
        first_tokens = []  # requests whose first token this step produced (stamped once the step is priced)
        prefill = decode = read = pairs = drafts = 0
        for s in out.scheduled:
            r = requests[s.request_id]
            n, first = s.num_new_tokens, s.start
            if first >= len(r.prompt_token_ids) and (n == 1 or s.draft_token_ids):
                decode += n  # a decode, or a drafted one: 1 + k tokens
            else:
                prefill += n
            read += first + n
            pairs += n * first + n * (n + 1) // 2
            if r.first_scheduled_time is None:
                r.first_scheduled_time = start
            if s.draft_token_ids:  # speculative: the tokens it kept (update counted them)
                drafts += n - 1
                changed[s.request_id] = (r, r.output_token_ids[len(r.output_token_ids) - out.num_appended[s.request_id]:])
            elif s.samples:
                changed[s.request_id] = (r, [sampled[s.request_id]])
                if r.first_token_time is None:
                    first_tokens.append(r)
                for fork_id, _ in s.forks:  # samples born this step, each with its first token
                    child = requests[fork_id]
                    child.first_scheduled_time = r.first_scheduled_time
                    changed[fork_id] = (child, [sampled[fork_id]])
                    first_tokens.append(child)
        stats = StepStats(
            step=len(self.step_stats), start_time=start, end_time=self.clock.now(),
            num_running=out.num_running, num_waiting=out.num_waiting,
            num_prefill_tokens=prefill, num_decode_tokens=decode, num_padded_tokens=out.num_padded_tokens,
            context_tokens_read=read, attention_context_tokens=pairs, kv_tokens_written=prefill + decode,
            kv_used_slots=self.kv.used_slots(), kv_allocated_slots=self.kv.allocated_slots(),
            kv_total_slots=self.pool.num_pages * self.pool.page_size,
            num_preemptions=len(out.preempted), page_owners=self._page_owners(),
            num_draft_tokens=drafts, num_accepted_tokens=out.num_accepted_drafts,
        )
        if self._draft_model is not None:  # a draft model: its passes are priced too
            stats.draft_model_rows, stats.draft_model_context_tokens, stats.draft_model_passes = \
                self._draft_model.take_work()
            stats.draft_layer_fraction = self._draft_model.layer_fraction
        self.clock.charge(stats)
        end = stats.end_time = self.clock.now()
        self.step_stats.append(stats)
        for r in first_tokens:
            r.first_token_time = end
        for r in finished:
            r.finish_time = end
            changed.setdefault(r.request_id, (r, []))
        of = RequestOutput.of
        return [of(r, new) for r, new in changed.values()]

    def _page_owners(self) -> list | None:
        if not self.config.record_page_owners:
            return None
        owners = [None] * self.pool.num_pages
        for rid, table in self.kv.tables.items():
            for page in table.pages:
                owners[page] = rid
        return owners

    # ------------------------------------------------------------------ convenience
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False) -> list[RequestOutput]:
        """Serve every prompt (a list of token-id lists) to the end; outputs in prompt order."""
        ids = self._add_all(prompts, sampling_params)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            # smoothing=0: the rate is requests done / time elapsed. The default moving average
            # keeps the rate of the first update when the rest finish in one burst (2.7 req/s
            # shown for 64 requests done in 0.4 s in a notebook).
            bar = tqdm(total=len(ids), desc="generate", unit="req", smoothing=0)
        pending = {sid: rid for rid in ids for sid in self._sample_ids(rid)}  # sample id -> id add_request gave
        left = {rid: len(self._sample_ids(rid)) for rid in ids}
        while pending:
            if not self.has_unfinished_requests:
                raise RuntimeError("engine has no work but requests are unfinished (bug)")
            for o in self.step():
                if o.finished and o.request_id in pending:
                    rid = pending.pop(o.request_id)
                    left[rid] -= 1
                    if bar is not None and not left[rid]:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [self.output(i) for i in ids]

    def _sample_ids(self, request_id: str) -> list[str]:
        group = self.groups.get(request_id)
        return [request_id] if group is None else [r.request_id for r in group]

    def output(self, request_id: str) -> RequestOutput:
        """The output of `request_id` now. For a group (n or best_of > 1): its `samples` are the answers
        (best_of: the n of highest cumulative logprob, best first; ties keep sample order), each with
        `index` its place in that list; the rest of the fields are those of `samples[0]`, with
        `finished` true once every sample is."""
        group = self.groups.get(request_id)
        if group is None:
            return RequestOutput.of(self.requests[request_id])
        outs = [RequestOutput.of(r) for r in group]
        n = self.group_params[request_id].n
        if len(outs) > n:
            outs = sorted(outs, key=lambda o: -o.cumulative_logprob)[:n]  # (sorted is stable: ties keep order)
            for i, o in enumerate(outs):
                o.index = i
        head = RequestOutput.of(next(r for r in group if r.request_id == outs[0].request_id))
        head.request_id, head.parent_id, head.index, head.samples = request_id, None, 0, outs
        head.finished = all(r.is_finished for r in group)
        return head

    def stream(self, prompts, sampling_params=None):
        """Like generate, but yields each RequestOutput as soon as a step changes it (a group's samples
        one by one: `parent_id` names the id generate would report)."""
        ids = set(self._add_all(prompts, sampling_params))
        samples = [sid for rid in ids for sid in self._sample_ids(rid)]
        while any(not self.requests[i].is_finished for i in samples):
            for o in self.step():
                if o.request_id in ids or o.parent_id in ids:
                    yield o

    def _add_all(self, prompts, sampling_params) -> list[str]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts")
        for p, sp in zip(prompts, sampling_params):  # validate all first: all or nothing
            self._validate("\0probe", p, sp)
        return [self.add_request(p, sp) for p, sp in zip(prompts, sampling_params)]

    def stats(self) -> dict:
        pc = self.prefix_cache
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_pages": self.pool.num_pages,
            "pages_used": self.pool.num_pages - self.pool.num_free_pages,
            "pages_free": self.pool.num_free_pages,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": len(self.step_stats),
            "prefix_queried_tokens": pc.queried_tokens if pc else 0,
            "prefix_hit_tokens": pc.hit_tokens if pc else 0,
            "prefix_hit_rate": pc.hit_rate if pc else 0.0,
            # Sharing: pages the running requests would hold more without it (prefix-cache hits and parallel
            # samples' shared prompt pages), and, since the start, pages forked samples took by reference
            # and pages copied on write.
            "kv_pages_saved_by_sharing": self.kv.pages_saved_by_sharing(),
            "forked_pages": self.kv.num_forked_pages,
            "copied_pages": self.kv.num_copied_pages,
        }

    def forget(self, request_id: str) -> None:
        """Drop the record of a finished request (or of a group once every sample is finished), so that a
        long-running server does not keep every request it served. Unfinished ones stay."""
        group = self.groups.get(request_id)
        if group is not None:
            if all(r.is_finished and r not in self.scheduler.running for r in group):
                del self.groups[request_id], self.group_params[request_id]
                for r in group:
                    self.requests.pop(r.request_id, None)
            return
        request = self.requests.get(request_id)
        if request is not None and request.parent_id is None and request.is_finished \
                and request not in self.scheduler.running:
            del self.requests[request_id]
