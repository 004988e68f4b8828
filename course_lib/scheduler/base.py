"""What every scheduler shares: two queues, preemption by recompute, and the one place where a
request advances.

A scheduler subclass writes `schedule()` (who runs this step, how many tokens each) and
`finish(request)` (retire a request that produced its last token). This base does the rest of
a request's life, so that its progress counter, `num_computed_tokens`, is written in this file
only:

- `_admit` starts a request (after a prefix-cache hit, at the first uncached token);
- `_make_room` preempts when pages run out: `choose_victim()` says who, `preempt(victim)` gives
  its pages back and requeues it to be recomputed (both meant to be overridden);
- `next_step()` completes the subclass's decision into the runner's whole input;
- `update(output, sampled)` advances every scheduled request after the forward pass: progress,
  new token, full pages into the prefix cache, stop decision, retirement.

Parallel sampling (SamplingParams.n / best_of): only a group's sample 0 is queued; its siblings
wait in its `forks`. The step that computes the last prompt token samples a first token for every
sample from the same logits (`ScheduledRequest.forks`, filled in by `next_step`), and `update`
forks the siblings then (`_fork`): each is a running request from that moment, holding the prompt's
pages by reference (`kv.fork`), its progress where sample 0's is. From there each sample is an
ordinary request: it decodes, stops, is preempted (and recomputed alone) or aborted on its own; the
KV manager copies a shared page the first time one of them writes into it. A scheduler keeps seats
for a group's unborn samples (`_seats_free`); only `ContinuousScheduler`'s `schedule()` does, so the
engine refuses n > 1 with any other.

Speculative decoding (course_lib/spec/): with a `drafter` set, `_propose_drafts` asks it once per
step for the running decodes' guesses and `_drafted_entry` schedules one as 1 + k tokens (budget and
pages for all of them, never a preemption for a guess); `update` keeps the longest prefix of drafts
the target agrees with plus the target's next token (`accept_drafts`), moves `num_computed_tokens`
to just those, and gives back the pages that held only rejected drafts (`kv.truncate`). Only
`ContinuousScheduler`'s `schedule()` drafts, so the engine refuses speculation with any other.
`accept_drafts` is the overridable part (like `choose_victim` / `preempt`); `_accept_drafts` counts
the drafts kept, offers the full pages to the prefix cache and retires a request that stopped.
"""
from __future__ import annotations

from collections import deque

from .output import ScheduledRequest, SchedulerOutput
from .request import FinishReason, Request, RequestStatus

# What happens to a request that cannot grow: "recompute" (preempt it, recompute it later) or
# "fail" (it ends in error). EngineConfig's OPTIONS["preemption"] is this tuple.
PREEMPTION_MODES = ("recompute", "fail")


class SchedulerBase:
    def __init__(self, kv, admission, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, preemption: str = "recompute", eos_token_ids=()):
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
        self.kv = kv
        self.admission = admission
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption = preemption
        self.eos_token_ids = frozenset(eos_token_ids)  # the model's EOS: ends a request unless ignore_eos
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the youngest is last
        self.num_preemptions = 0
        self._admit_counter = 0
        self._live: dict[str, Request] = {}  # every request added and not yet delivered, by id
        self._gone: list[str] = []  # ids delivered since the last step (the runner may drop their state)
        self._forking: dict[str, Request] = {}  # sample 0 of each group whose siblings are still unborn
        # Speculative decoding (set by the engine): the drafter, or None (off); drafts and kept drafts so far.
        self.drafter = None
        self.num_drafts = 0  # drafted rows (a request's 1 + k tokens in one step): vLLM's spec_decode_num_drafts
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_position: list[int] = []  # [i]: drafted rows whose draft i + 1 was kept

    # -- questions --------------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- what a subclass writes -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Who runs this step and how many tokens each computes: one `ScheduledRequest` each."""
        raise NotImplementedError

    def finish(self, request: Request) -> list[Request]:
        """`request` has produced its last token. Returns the requests whose answers are now
        delivered (the continuous scheduler delivers at once; the static one when the bus arrives)."""
        raise NotImplementedError

    # -- preemption (override these to choose differently) ----------------------------------
    def choose_victim(self) -> Request:
        """The running request that gives its pages back when the pool is full: the youngest
        still generating (a static bus's finished passengers hold no pages)."""
        return self.running[max(i for i, r in enumerate(self.running) if r.finish_reason is None)]

    def preempt(self, request: Request) -> None:
        """Preemption by recompute: `request` leaves the batch, gives back every page, forgets its
        progress and waits at the front of the queue, to be recomputed from its prompt and the
        tokens it already produced (those are kept)."""
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    # -- actions the subclass calls ---------------------------------------------------------
    def add(self, request: Request) -> None:
        self._live[request.request_id] = request
        if request.forks:
            self._forking[request.request_id] = request
        self.waiting.append(request)

    def _seats_free(self) -> int:
        """Seats left for new requests: those not taken by running requests nor kept for the unborn
        samples of running groups (they join the batch when their prompt is done)."""
        kept = sum(len(r.forks) for r in self._forking.values() if r.status is RequestStatus.RUNNING) \
            if self._forking else 0
        return self.max_num_seqs - len(self.running) - kept

    def _admit(self, request: Request, num_new_tokens: int, cached_pages) -> None:
        """Start `request` with room for `num_new_tokens`; it skips the tokens its cached pages hold."""
        request.num_cached_tokens = self.kv.allocate(request, num_new_tokens, cached_pages)
        request.num_computed_tokens = request.num_cached_tokens
        request.status = RequestStatus.RUNNING
        request.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running.append(request)

    def _make_room(self, request: Request, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt running requests until `request` can grow by `num_new_tokens`.
        False if `request` itself had to go."""
        while not self.kv.can_allocate(request, num_new_tokens):
            victim = self.choose_victim()
            if any(s.request_id == victim.request_id for s in out.scheduled):
                raise RuntimeError(f"choose_victim() returned {victim.request_id!r}, which already runs this step: "
                                   "preempt a request not scheduled yet (the default takes the youngest)")
            victim.num_preemptions += 1
            self.num_preemptions += 1
            out.preempted.append(victim.request_id)
            if self.preemption == "fail":
                self._fail(victim, out)
            else:
                self.preempt(victim)
                if victim in self.running:  # an overridden preempt that forgot: the loop would spin forever
                    raise RuntimeError(f"preempt({victim.request_id!r}) left it in self.running: a preempted "
                                       "request must leave the batch (and give its pages back)")
            if victim is request:
                return False
        return True

    def _fail(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.ERROR
        request.error = (f"out of KV pages mid-generation ({self.kv.num_pages} pages in the pool) "
                         "and preemption is off")
        out.failed.append(request.request_id)
        for child in self._unborn(request):  # its siblings cannot be born without its prompt: they fail too
            child.status, child.finish_reason, child.error = RequestStatus.FINISHED, FinishReason.ERROR, request.error
            self._live[child.request_id] = child
            out.failed.append(child.request_id)

    def _unborn(self, request: Request) -> list[Request]:
        """`request`'s siblings not yet forked (and not aborted); forgets them."""
        self._forking.pop(request.request_id, None)
        children = [c for c in request.forks if c.status is not RequestStatus.FINISHED]
        request.forks = ()
        return children

    def abort(self, request: Request) -> None:
        heirs = self._unborn(request) if request.forks else []
        if heirs:  # sample 0 leaves before its prompt was computed: the next sample takes its place
            heir = heirs[0]
            heir.forks = heirs[1:]
            self._live[heir.request_id] = heir
            if heir.forks:
                self._forking[heir.request_id] = heir
        if request in self.waiting:
            if heirs:
                self.waiting[self.waiting.index(request)] = heir
            else:
                self.waiting.remove(request)
        else:
            if request in self.running:
                self.running.remove(request)
                self.kv.free(request)
            if heirs:
                self.waiting.appendleft(heir)
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.ABORTED
        if self._live.pop(request.request_id, None) is not None:
            self._gone.append(request.request_id)

    # -- one step ---------------------------------------------------------------------------
    def next_step(self) -> SchedulerOutput:
        """`schedule()`'s decision, completed into everything the runner needs: each entry's
        token ids, page ids and sampling parameters, and the ids gone since the last step."""
        out = self.schedule()
        live, tables = self._live, self.kv.tables
        for s in out.scheduled:
            if s.token_ids is not None:  # the subclass filled it in itself
                p = s.sampling_params
                if p is not None and s.samples and p.adjusts_logits:
                    r = live[s.request_id]
                    s.history = (r.prompt_token_ids, r.output_token_ids)
                continue
            r = live[s.request_id]
            start, end, prompt = s.start, s.start + s.num_new_tokens, r.prompt_token_ids
            if end <= len(prompt):
                s.token_ids = prompt[start:end]
            else:  # (part of) the tokens it generated: a decode, or a recompute after preemption
                output, p = r.output_token_ids, len(prompt)
                s.token_ids = prompt[start:] + output[: end - p] if start < p else output[start - p: end - p]
            s.page_ids = tables[s.request_id].pages
            s.sampling_params = r.sampling_params
            if s.samples and r.sampling_params.adjusts_logits:
                s.history = (r.prompt_token_ids, r.output_token_ids)
        if self._forking:  # the step that samples a group's first token samples its siblings' too
            for s in out.scheduled:
                r = self._forking.get(s.request_id)
                if r is not None and s.samples:
                    s.forks = tuple((c.request_id, c.sampling_params) for c in r.forks
                                    if c.status is not RequestStatus.FINISHED)
        kv = self.kv
        if kv.pending_copies:  # copy on write: the runner copies these pages before the forward pass
            out.page_copies, kv.pending_copies = kv.pending_copies, []
        out.finished_ids, self._gone = self._gone, []
        if self.drafter is not None and out.finished_ids:
            self.drafter.forget(out.finished_ids)
        out.num_running, out.num_waiting = len(self.running), len(self.waiting)
        return out

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """The forward pass of `out` is done and produced `sampled` (request id -> token). Advance
        every scheduled request: its progress, its new token, its full pages into the prefix
        cache, and whether it stops. Returns the requests finished by this step (delivered or
        failed), in the order they finished."""
        live, eos, max_len = self._live, self.eos_token_ids, self.kv.max_model_len
        commit = self.kv.commit if self.kv.prefix_cache is not None else None
        logprobs = getattr(sampled, "logprobs", None) or None  # only a runner asked for logprobs has them
        finished = [live.pop(rid) for rid in out.failed]
        self._gone += out.failed
        for s in out.scheduled:
            r = live[s.request_id]
            if s.draft_token_ids:
                self._accept_drafts(r, s, sampled[s.request_id], out, finished, commit)
                continue
            r.num_computed_tokens += s.num_new_tokens
            if commit is not None:
                commit(r)
            if not s.samples:
                continue
            if s.forks:
                self._fork(r, s.forks, sampled, logprobs, finished)
            token = sampled[s.request_id]
            output = r.output_token_ids
            output.append(token)
            if logprobs is not None and s.request_id in logprobs:
                _add_logprob(r, logprobs[s.request_id])
            p = r.sampling_params
            # Most tokens stop nothing: say so in one expression (this runs for every token).
            if (token not in eos or p.ignore_eos) and len(output) < p.max_tokens \
                    and len(r.prompt_token_ids) + len(output) < max_len and token not in p.stop_token_ids:
                continue
            reason = self._stop_reason(r, token)
            if reason is not None:
                self._retire(r, reason, finished)
        return finished

    # -- speculative decoding ---------------------------------------------------------------
    def _propose_drafts(self) -> dict:
        """{request id: (draft tokens, their q or None)} for the running requests in decode that may
        speculate: not those whose sampling adjusts logits or reports logprobs (their drafts would
        need the history and logprobs of tokens not yet kept), and never more drafts than tokens the
        request may still produce, minus the one the target always adds."""
        candidates, limits = [], []
        max_len = self.kv.max_model_len
        for r in self.running:
            p = r.sampling_params
            num_tokens = len(r.prompt_token_ids) + len(r.output_token_ids)
            if num_tokens != r.num_computed_tokens + 1 or p.adjusts_logits or p.needs_logprobs:
                continue
            room = min(p.max_tokens - len(r.output_token_ids), max_len - num_tokens) - 1
            if room > 0:
                candidates.append(r)
                limits.append(room)
        return self.drafter.propose(candidates, limits) if candidates else {}

    def _drafted_entry(self, request: Request, drafted: tuple, budget: int):
        """The entry of a decode with its drafts (as many as the budget leaves room for), or None when
        no draft fits, or when they would need pages the pool does not have free: a guess never
        preempts anyone (the plain decode path then runs, which may)."""
        tokens, probs = drafted
        k = min(len(tokens), budget - 1)
        if k <= 0 or not self.kv.can_allocate(request, 1 + k):
            return None
        self.kv.allocate(request, 1 + k)
        output = request.output_token_ids
        last = output[-1] if output else request.prompt_token_ids[-1]
        drafts = tuple(tokens[:k])
        return ScheduledRequest(request.request_id, 1 + k, request.num_computed_tokens, True, [last, *drafts],
                                self.kv.tables[request.request_id].pages, request.sampling_params,
                                draft_token_ids=drafts, draft_probs=None if probs is None else probs[:k])

    def accept_drafts(self, request: Request, entry, targets: list) -> FinishReason | None:
        """`entry` computed `request`'s last token and k drafts (`entry.draft_token_ids`, from position
        `entry.start`); `targets` are the target's tokens at those 1 + k positions. Append the drafts up
        to the first disagreement and the target's token there (all k agreeing: the target's next one),
        stopping early at a stop token, EOS or a length limit; move the request's progress past the
        last token and the kept drafts only; give back the pages that held only rejected drafts.
        Returns why the request stops, or None. (Notebook 9 has you write this.)"""
        drafts = entry.draft_token_ids
        kept = 0
        while kept < len(drafts) and drafts[kept] == targets[kept]:
            kept += 1
        output, reason, appended = request.output_token_ids, None, 0
        for token in targets[: kept + 1]:
            output.append(token)
            appended += 1
            reason = self._stop_reason(request, token)
            if reason is not None:
                break
        request.num_computed_tokens = entry.start + appended  # the last token and the kept drafts (K/V written)
        self.kv.truncate(request, request.num_computed_tokens)
        return reason

    def _accept_drafts(self, r: Request, s, targets: list, out: SchedulerOutput, finished: list, commit) -> None:
        """`accept_drafts`, then what every drafted row records: the counters, the prefix cache, retirement."""
        before = len(r.output_token_ids)
        reason = self.accept_drafts(r, s, targets)
        appended = len(r.output_token_ids) - before
        drafts = s.draft_token_ids
        kept = 0
        while kept < min(len(drafts), appended) and drafts[kept] == r.output_token_ids[before + kept]:
            kept += 1
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += kept
        per_position = self.accepted_per_position
        if len(per_position) < len(drafts):
            per_position += [0] * (len(drafts) - len(per_position))
        for i in range(kept):
            per_position[i] += 1
        out.num_appended[r.request_id] = appended
        out.num_accepted_drafts += kept
        if commit is not None:
            commit(r)
        if reason is not None:
            self._retire(r, reason, finished)

    def _retire(self, r: Request, reason: FinishReason, finished: list) -> None:
        r.finish_reason = reason
        self._deliver(self.finish(r), finished)

    def _deliver(self, done: list[Request], finished: list) -> None:
        """Hand finished requests back: FINISHED, no longer live, and in this step's `finished`."""
        for request in done:
            request.status = RequestStatus.FINISHED
            if self._live.pop(request.request_id, None) is not None:
                self._gone.append(request.request_id)
            finished.append(request)

    def _fork(self, leader: Request, forks: tuple, sampled: dict, logprobs, finished: list) -> None:
        """`leader`'s prompt is computed: its siblings are born now, sharing its pages, each with the
        first token the runner drew for it from the same logits."""
        children = {c.request_id: c for c in self._unborn(leader)}
        for cid, _ in forks:
            child = children.get(cid)
            if child is None:
                continue  # aborted since
            child.num_computed_tokens = leader.num_computed_tokens
            self.kv.fork(leader, child)
            child.status = RequestStatus.RUNNING
            child.admit_seq = self._admit_counter
            self._admit_counter += 1
            self.running.append(child)
            self._live[cid] = child
            token = sampled[cid]
            child.output_token_ids.append(token)
            if logprobs is not None and cid in logprobs:
                _add_logprob(child, logprobs[cid])
            reason = self._stop_reason(child, token)
            if reason is not None:
                self._retire(child, reason, finished)

    def _stop_reason(self, r: Request, token: int) -> FinishReason | None:
        p = r.sampling_params
        if token in p.stop_token_ids:
            return FinishReason.STOP
        if token in self.eos_token_ids and not p.ignore_eos:
            return FinishReason.EOS
        num_output = len(r.output_token_ids)  # (not the properties: this runs for every token)
        if num_output >= p.max_tokens or len(r.prompt_token_ids) + num_output >= self.kv.max_model_len:
            return FinishReason.LENGTH
        return None


def _add_logprob(request: Request, entry: tuple) -> None:
    """One sampled token's (logprob, top alternatives), from the runner."""
    if request.logprobs is None:
        request.logprobs = []
    request.logprobs.append(entry)
    request.cumulative_logprob += entry[0]
