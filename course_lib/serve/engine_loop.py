"""One thread owns the engine and steps it for every connection.

HTTP handlers never touch the engine. They `submit` commands (add a request, abort one, pause,
...) to a thread-safe queue; the loop runs them between steps, steps the engine while it has
work, and hands every request's new tokens (`RequestOutput.new_token_ids`) back to the asyncio
queue of the handler that waits for them, with one `call_soon_threadsafe` per event loop per
step (not one per token: 64 streams at hundreds of steps a second would flood the loop).

A handler whose client leaves calls `abort`: the request leaves the batch and its pages go back
to the pool before the next step. A handler that ends an answer itself (a stop string, found in
the decoded text) calls `abort(request_id, "stop")`: the same, but the request counts as finished
for that reason, with its latencies, in /metrics and on the dashboard. Bad input (`ValueError`
from `add_request`) and a full queue come back to the handler as a rejection before any byte of
the response is sent.

Dashboard state (seats, queue, pages), its controls and the Prometheus text go through one
door, `control(action, *args)`, run on this thread between steps (`await loop.ask("snapshot")`):
a name and plain arguments, so the same requests reach an engine in another process
(`engine_process.py`), where `deliver` replaces the asyncio hand-off with a pipe.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from course_lib.engine import RequestOutput

from . import snapshot
from .protocol import APIError

log = logging.getLogger("course_lib.serve")

IDLE_WAIT_S = 0.25  # how long an idle loop sleeps on its command queue before looking again
STEP_HISTORY = 2000  # StepStats the engine keeps (it appends one per step, forever, otherwise)
TURNSTILE_STEPS = 48  # columns of the dashboard's turnstile
ROLLING_WINDOW_S = 10.0  # the dashboard's rolling TTFT / TPOT / throughput
# Why an answer may end on the API side (a finish reason of the engine's, or "aborted" when None).
API_FINISH_REASONS = ("stop",)


@dataclass(slots=True)
class Delta:
    """What one step did to one request, as its handler sees it."""

    new_token_ids: list
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    index: int = 0  # which sample of a request with n / best_of > 1
    logprobs: list | None = None  # with logprobs asked: (logprob, top alternatives) of each new token
    cumulative_logprob: float = 0.0  # (finished deltas of samples with logprobs: what best_of ranks by)


ACCEPTED = "accepted"  # the first item of an admitted request's queue


class RequestStream:
    """The handler's end of one request: items arrive on `queue` (ACCEPTED or an APIError first,
    then Deltas until one is finished)."""

    def __init__(self, request_id: str, kind: str = "completion"):
        self.request_id = request_id
        self.kind = kind
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self._nap: asyncio.Future | None = None

    def put(self, item) -> None:
        """Hand the handler an item (on its event loop); the last one (a finished Delta, or None
        for a client gone) also ends a `nap`: an answer's end never waits for the chunk interval."""
        self.queue.put_nowait(item)
        if self._nap is not None and (item is None or getattr(item, "finished", True)) and not self._nap.done():
            self._nap.set_result(None)

    async def nap(self, seconds: float) -> None:
        """Sleep `seconds` (tokens pile up meanwhile), or less if the request's last item arrives."""
        self._nap = self.loop.create_future()
        timer = self.loop.call_later(seconds, _settle, self._nap, None, None)
        try:
            await self._nap
        finally:
            timer.cancel()
            self._nap = None

    def get_nowait_all(self) -> list:
        items = []
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        return items


@dataclass
class Rolling:
    """Recent finishes and tokens, for the dashboard's rolling numbers."""

    finishes: deque = field(default_factory=deque)  # (time, ttft, tpot)
    tokens: deque = field(default_factory=deque)  # (time, tokens produced by a step)

    def trim(self, now: float) -> None:
        for d in (self.finishes, self.tokens):
            while d and d[0][0] < now - ROLLING_WINDOW_S:
                d.popleft()

    def summary(self, now: float) -> dict:
        self.trim(now)
        ttfts = sorted(t for _, t, _ in self.finishes if t is not None)
        tpots = sorted(t for _, _, t in self.finishes if t is not None)
        span = min(ROLLING_WINDOW_S, max(1e-9, now - self.tokens[0][0])) if self.tokens else ROLLING_WINDOW_S
        return {"ttft_p50_ms": _median(ttfts) * 1e3 if ttfts else None,
                "tpot_p50_ms": _median(tpots) * 1e3 if tpots else None,
                "throughput_tok_s": sum(n for _, n in self.tokens) / span if self.tokens else 0.0,
                "finished_in_window": len(self.finishes), "window_s": ROLLING_WINDOW_S}


def _median(sorted_values):
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else 0.5 * (sorted_values[mid - 1] + sorted_values[mid])


class EngineLoop:
    def __init__(self, engine, max_waiting: int | None = None, metrics=None, deliver=None):
        """`deliver(items)`: if given, called once per loop iteration with every (stream, item)
        posted since the last call (possibly none), instead of handing items to each stream's
        asyncio loop: how an engine process sends its results down a pipe."""
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 (or None for no limit), got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream | None] = {}  # live request id -> its handler (None: internal)
        self._samples_left: dict[str, int] = {}  # a request with n / best_of > 1: its samples not yet ended
        self._outbox: dict = {}  # asyncio loop -> [(stream, item)] to deliver after this iteration
        self.deliver = deliver
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stopping = False
        self.paused = False
        self._single_steps = 0
        self.num_steps = 0
        self.num_step_errors = 0
        self.busy_s = 0.0  # time spent inside engine.step()
        self.stats = engine.stats()  # published after every step (a fresh dict: safe to read anywhere)
        self.rolling = Rolling()
        self.seats = snapshot.SeatMap(engine.config.max_num_seqs)
        self.turnstile: deque = deque(maxlen=TURNSTILE_STEPS)  # (step number, seat column)
        self.dashboard_seen = 0.0  # monotonic time a dashboard last asked: track seats only then
        self.started_at = time.monotonic()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._commands.put(lambda: None)  # wake it
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    # ------------------------------------------------------------------ commands (any thread)
    def submit(self, command) -> None:
        """Run `command()` on the engine thread before its next step."""
        self._commands.put(command)

    async def call(self, command):
        """Run `command()` on the engine thread and await its result (or exception)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def run():
            try:
                result, error = command(), None
            except Exception as err:  # handed to the caller, never kills the loop
                result, error = None, err
            loop.call_soon_threadsafe(_settle, future, result, error)

        self.submit(run)
        return await future

    async def ask(self, action: str, *args):
        """`control(action, *args)` on the engine thread, awaited (the dashboard, /metrics)."""
        return await self.call(lambda: self.control(action, *args))

    def add(self, stream: RequestStream, prompt_token_ids, params) -> None:
        self.submit(lambda: self._add(stream, prompt_token_ids, params))

    def abort(self, request_id: str, reason: str | None = None) -> None:
        """End a request now: its client left (`reason` None), or its answer is complete (`reason`
        "stop": a stop string)."""
        self.submit(lambda: self._abort(request_id, reason))

    # ------------------------------------------------------------------ commands (engine thread)
    def _add(self, stream: RequestStream | None, prompt, params) -> bool:
        rid = stream.request_id if stream is not None else None
        if self.max_waiting is not None and self.engine.stats()["num_waiting"] >= self.max_waiting:
            if self.metrics is not None:
                self.metrics.rejected("queue_full")
            self._post(stream, APIError(
                f"server busy: the waiting queue is full ({self.max_waiting} requests, --max-waiting); retry shortly",
                status=429, type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"}))
            return False
        try:
            rid = self.engine.add_request(prompt, params, request_id=rid)
        except ValueError as err:  # the engine names the problem and the limit
            if self.metrics is not None:
                self.metrics.rejected("invalid")
            self._post(stream, APIError(str(err)))
            return False
        self._streams[rid] = stream
        if params.num_samples > 1:
            self._samples_left[rid] = params.num_samples
        self._post(stream, ACCEPTED)
        return True

    def inject(self, prompts, params) -> int:
        """Requests with no HTTP client (the dashboard's burst): served and measured, answers dropped."""
        return sum(self._add(None, prompt, params) for prompt in prompts)

    def _abort(self, request_id: str, reason: str | None = None) -> None:
        if request_id in self._streams:
            del self._streams[request_id]
            self._samples_left.pop(request_id, None)
            self.engine.abort(request_id)  # frees its pages now (every sample's, for n > 1)
            if reason in API_FINISH_REASONS:  # the answer is whole: a finish, timed like any other
                self._finished(RequestOutput.of(self.engine.requests[request_id]), time.monotonic(), reason)
            elif self.metrics is not None:
                self.metrics.aborted(request_id)
            snapshot.forget_request(self.engine, request_id)
            return
        request = self.engine.requests.get(request_id)
        parent = None if request is None else request.parent_id
        if parent in self._streams and not request.is_finished:  # one sample of several (its stop string)
            self.engine.abort(request_id)
            out = RequestOutput.of(request)
            if reason in API_FINISH_REASONS:
                self._finished(out, time.monotonic(), reason)
            elif self.metrics is not None:
                self.metrics.aborted(request_id)
            stream = self._streams[parent]
            if stream is not None:  # every sample ends with one finished delta (an engine process counts them)
                self._post(stream, Delta([], True, reason or "aborted", None, len(out.prompt_token_ids),
                                         len(out.token_ids), out.index))
            self._sample_ended(parent)

    def pause(self, paused: bool) -> None:
        self.paused = paused
        self._single_steps = 0

    def single_step(self) -> None:
        self.paused = True
        self._single_steps += 1

    def control(self, action: str, *args):
        """Everything the dashboard and /metrics ask of the engine, by name (engine thread only)."""
        if action == "snapshot":
            self.dashboard_seen = time.monotonic()
            return self.build_snapshot()
        if action == "pause":
            return self.pause(True)
        if action == "resume":
            return self.pause(False)
        if action == "step":
            return self.single_step()
        if action == "admission":
            return snapshot.set_admission(self.engine, *args)
        if action == "inject":
            return self.inject(*args)
        if action == "metrics":
            if self.metrics is None:
                return None
            from .metrics import speculation_totals

            return self.metrics.render(self.engine.stats(), self.num_steps, speculation_totals(self.engine.scheduler))
        raise ValueError(f"unknown engine control {action!r}")

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stopping:
            busy = self.engine.has_unfinished_requests and (not self.paused or self._single_steps > 0)
            commands = self._take_commands(0.0 if busy else IDLE_WAIT_S)  # block only with nothing to step
            for command in commands:
                command()
            if commands:  # adds, aborts and controls change what the stats say, step or no step
                self.stats = self.engine.stats()
            if self.engine.has_unfinished_requests and (not self.paused or self._single_steps > 0):
                if self._single_steps > 0:
                    self._single_steps -= 1
                self._step()
            self._flush()
        self._shutdown()

    def _take_commands(self, wait_s: float) -> list:
        """Every command queued now, after waiting up to `wait_s` seconds for the first."""
        taken = []
        try:
            taken.append(self._commands.get(timeout=wait_s) if wait_s > 0 else self._commands.get_nowait())
            while True:
                taken.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        return taken

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as err:  # a bug in the engine must not take the server down
            self.num_step_errors += 1
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(f"engine error: {type(err).__name__}: {err}")
            return
        self.num_steps += 1
        self.busy_s += time.perf_counter() - start
        now = time.monotonic()
        if self.metrics is not None:
            step_stats = self.engine.step_stats
            self.metrics.step(outputs, step_stats[-1].end_time if step_stats else self.engine.clock.now())
        streams, post, tokens = self._streams, self._post, 0
        for out in outputs:
            new = out.new_token_ids
            tokens += len(new)
            rid = out.request_id
            if rid not in streams:
                if out.parent_id is not None and out.parent_id in streams:
                    self._sample_step(out, now)
                continue  # (else aborted by its client in the meantime)
            stream = streams[rid]
            if out.finished:
                del streams[rid]
                self._finished(out, now)
                if stream is not None:
                    post(stream, Delta(new, True, out.finish_reason, out.error, len(out.prompt_token_ids),
                                       len(out.token_ids), 0, out.new_logprobs, out.cumulative_logprob))
                snapshot.forget_request(self.engine, rid)
            elif stream is not None:
                post(stream, Delta(new) if out.new_logprobs is None else Delta(new, logprobs=out.new_logprobs))
        if tokens:
            self.rolling.tokens.append((now, tokens))
        self.rolling.trim(now)
        self.stats = self.engine.stats()
        snapshot.trim_step_history(self.engine, STEP_HISTORY)
        if self.dashboard_watching():
            self.turnstile.append((self.num_steps, self.seats.update(self.engine)))

    def _sample_step(self, out, now: float) -> None:
        """One sample of a request with n / best_of > 1 changed: its delta, with its index, to the handler."""
        parent = out.parent_id
        stream = self._streams[parent]
        if out.finished:
            self._finished(out, now)
            if stream is not None:
                self._post(stream, Delta(out.new_token_ids, True, out.finish_reason, out.error,
                                         len(out.prompt_token_ids), len(out.token_ids), out.index, out.new_logprobs,
                                         out.cumulative_logprob))
            self._sample_ended(parent)
        elif stream is not None:
            self._post(stream, Delta(out.new_token_ids, index=out.index, logprobs=out.new_logprobs))

    def _sample_ended(self, parent: str) -> None:
        """A sample ended (the engine's finish, or its stop string): the request ends with its last one."""
        self._samples_left[parent] -= 1
        if not self._samples_left[parent]:
            del self._samples_left[parent], self._streams[parent]
            snapshot.forget_request(self.engine, parent)

    def _finished(self, out, now: float, reason: str | None = None) -> None:
        """`out` has ended, for the engine's reason or for `reason` (the API's)."""
        reason = reason or out.finish_reason
        n = len(out.token_ids)
        if reason not in ("error", "aborted"):
            tpot = (out.finish_time - out.first_token_time) / (n - 1) if n > 1 and out.first_token_time else None
            self.rolling.finishes.append((now, out.ttft, tpot))
        if self.metrics is not None:
            request = self.engine.requests.get(out.request_id)
            self.metrics.finished(out, reason, None if request is None else request.sampling_params.max_tokens)

    def _fail_all(self, message: str) -> None:
        self._samples_left.clear()
        for rid, stream in list(self._streams.items()):
            del self._streams[rid]
            try:
                self.engine.abort(rid)
            except Exception:  # the engine is already in trouble; the client still hears why
                log.exception("abort after a failed step")
            if self.metrics is not None:
                self.metrics.aborted(rid, "error")
            if stream is not None:
                self._post(stream, Delta([], True, "error", message))
        self.stats = self.engine.stats()

    def _shutdown(self) -> None:
        for rid, stream in list(self._streams.items()):
            if stream is not None:
                self._post(stream, Delta([], True, "error", "server shutting down"))
        self._streams.clear()
        self._flush()

    # ------------------------------------------------------------------ delivery
    def _post(self, stream: RequestStream | None, item) -> None:
        if stream is not None:
            self._outbox.setdefault(stream.loop, []).append((stream, item))

    def _flush(self) -> None:
        if self.deliver is not None:
            outbox, self._outbox = self._outbox, {}
            self.deliver([pair for items in outbox.values() for pair in items])
            return
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: its clients are gone
                pass

    # ------------------------------------------------------------------ dashboard
    def dashboard_watching(self) -> bool:
        return time.monotonic() - self.dashboard_seen < 3.0

    def build_snapshot(self, now: float | None = None) -> dict:
        """Everything the dashboard draws, as plain JSON data (engine thread only)."""
        now = time.monotonic() if now is None else now
        engine = self.engine
        waiting = snapshot.waiting_ids(engine, limit=40)
        return {
            "time": now - self.started_at,
            "step": self.num_steps,
            "paused": self.paused,
            "admission": snapshot.admission_name(engine),
            "stats": dict(self.stats),
            "num_seats": self.seats.num_seats,
            "turnstile": [{"step": s, "seats": col} for s, col in self.turnstile],
            "waiting": waiting,
            "pages": snapshot.page_map(engine),
            "rolling": self.rolling.summary(now),
        }


def _settle(future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _deliver(items) -> None:
    for stream, item in items:
        stream.put(item)
