"""The engine in a process of its own: what `python -m course_lib serve` runs by default.

Why a process and not a thread: the engine's Python work (scheduling, building the batch,
sampling, bookkeeping) and the HTTP server's (a chunk for every stream at every step) would share
one interpreter lock. Every torch or C call the engine makes lets go of the lock, and getting it
back means waiting for the HTTP thread. Measured with the tiny model at 64 streams on 2 cores: a
neighbour thread busy 30% of the time costs the engine ~20% of its throughput and ~25% more CPU
per token; a neighbour process costs it nothing measurable. vLLM's V1 splits its server the same
way (the API server and EngineCore in separate processes).

    API process (uvicorn, asyncio)                           engine process
      EngineClient.add / abort / ask ──── command pipe ────▶ PipedEngineLoop, its only thread:
      each stream's asyncio queue    ◀─── output pipe ─────  reads commands between steps, steps,
                                                             sends one message per iteration

Messages are tuples of plain values, pickled, in length-prefixed frames (see `frame_bytes`):
    to the engine:   ("add", rid, prompt_ids, params)  ("abort", rid, reason)  ("ask", call_id, action, args)
                     ("stop",)
    from it:         ("ready", info)  ("failed", message)  ("out", [(rid, item)], num_steps, busy_s)
                     ("answer", call_id, ok, value)
An item is "accepted", a running stream's new ids (a list; ("more", ids, index, logprobs) for a
sample of n > 1 or with logprobs), ("done", ...) or ("rejected", ...).
The API side reads the output pipe from its event loop and writes commands without ever blocking
(a part at a time when the pipe is full). `EngineClient` offers the API side what `EngineLoop`
does in a thread (`add`, `abort`, `ask`, `alive`, `num_steps`, `busy_s`, `stop`), so app.py and
dashboard.py serve either one unchanged.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import pickle
import select

from .engine_loop import ACCEPTED, Delta, EngineLoop
from .protocol import APIError

log = logging.getLogger("course_lib.serve")

START_TIMEOUT_S = 600.0  # loading a real checkpoint (and building the C kernels) can take minutes


# ------------------------------------------------------------------------------ engine side
class RemoteStream:
    """The engine process's stand-in for a handler: only the request id crosses the pipe."""

    __slots__ = ("request_id",)
    loop = None

    def __init__(self, request_id: str):
        self.request_id = request_id


# Items in the output pipe, in the cheapest shapes to pickle (64 of them a step): a Delta still
# running, of a request's only sample and without logprobs, is its list of new token ids alone.
def _encode(item):
    if isinstance(item, Delta):
        if not item.finished:
            if item.index == 0 and item.logprobs is None:
                return list(item.new_token_ids)
            return ("more", list(item.new_token_ids), item.index, item.logprobs)
        return ("done", list(item.new_token_ids), item.finish_reason, item.error, item.num_prompt_tokens,
                item.num_output_tokens, item.index, item.logprobs, item.cumulative_logprob)
    if isinstance(item, APIError):
        return ("rejected", item.message, item.status, item.type, item.param, item.code, item.headers)
    return item  # ACCEPTED


def _decode(item):
    if type(item) is list:
        return Delta(item)
    if item == ACCEPTED:
        return ACCEPTED  # the handler checks identity: the pipe gave us a copy
    if item[0] == "more":
        return Delta(item[1], index=item[2], logprobs=item[3])
    if item[0] == "done":
        return Delta(item[1], True, *item[2:])
    _, text, status, kind, param, code, headers = item
    return APIError(text, status=status, type=kind, param=param, code=code, headers=headers)


# Both pipes carry frames of our own (a 4-byte length, then the pickle), not Connection.send's: the
# API side's ends are non-blocking (it writes a part at a time when a pipe is full, and its event
# loop makes the read end non-blocking too), so a frame may arrive in pieces, and Connection.recv
# on a non-blocking pipe fails with BlockingIOError halfway through a message.
def frame_bytes(message) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(4, "big") + data


def read_frame(fd: int):
    """One message from a blocking pipe (EOFError when the writer has gone)."""
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    return pickle.loads(_read_exactly(fd, size))


def write_frame(fd: int, message) -> None:
    """One message into a blocking pipe, whole."""
    data = memoryview(frame_bytes(message))
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the pipe's writer has gone")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class PipedEngineLoop(EngineLoop):
    """The engine process's loop: its commands come down the command pipe, read by the engine's
    own thread between steps (a reader thread would take the interpreter lock from the engine at
    every message), and what it posts goes up the output pipe, one message per iteration."""

    def __init__(self, engine, commands, outputs, max_waiting=None, metrics=None):
        super().__init__(engine, max_waiting=max_waiting, metrics=metrics, deliver=self._send_out)
        self._pipe_in, self._pipe_out, self._reported_steps = commands, outputs, -1
        # Connection.poll builds a selector at every call (~10 us); one poll object, asked each step.
        self._poller = select.poll()
        self._poller.register(commands.fileno(), select.POLLIN)

    def _take_commands(self, wait_s: float) -> list:
        taken = []
        try:
            wait_ms = int(wait_s * 1000)
            while self._poller.poll(wait_ms):  # readable, or hung up (then read_frame raises EOFError)
                taken.append(self._command(read_frame(self._pipe_in.fileno())))
                wait_ms = 0
        except (EOFError, OSError):  # the API process is gone: so is the reason to run
            self._stopping = True
        return taken

    def _command(self, message):
        kind = message[0]
        if kind == "add":
            return lambda: self._add(RemoteStream(message[1]), message[2], message[3])
        if kind == "abort":  # the reason: None (the client left) or the API's finish reason (a stop string)
            reason = message[2] if len(message) > 2 else None
            return lambda: self._abort(message[1], reason)
        if kind == "ask":
            return lambda: self._answer(message[1], message[2], message[3])
        if kind == "stop":
            return self.stop_now
        raise ValueError(f"unknown command {kind!r} from the API process")

    def stop_now(self) -> None:
        self._stopping = True

    def _answer(self, call_id, action, args) -> None:
        try:
            message = ("answer", call_id, True, self.control(action, *args))
        except Exception as err:
            message = ("answer", call_id, False, (type(err).__name__, str(err)))
        write_frame(self._pipe_out.fileno(), message)

    def _send_out(self, items) -> None:
        """One message per loop iteration that has news: items, or a step count /health shows."""
        if not items and self.num_steps == self._reported_steps:
            return
        self._reported_steps = self.num_steps
        write_frame(self._pipe_out.fileno(), ("out", [(stream.request_id, _encode(item)) for stream, item in items],
                                              self.num_steps, self.busy_s))


def build_engine(args):
    """(engine, tokenizer, served name) from the serve command line's arguments."""
    import torch

    from course_lib import LLMEngine

    from .cli import engine_config_from_args, load_model

    torch.set_num_threads(args.threads)
    config = engine_config_from_args(args)
    model, tokenizer, default_name = load_model(args.model, args.dtype, args.device, args.max_model_len)
    return LLMEngine(model, config), tokenizer, args.served_model_name or default_name


def engine_main(commands, outputs, args) -> None:
    """The engine process: build the engine, say ready, then obey the command pipe until it closes."""
    try:
        engine, tokenizer, name = build_engine(args)
        from .metrics import ServerMetrics, speculative_positions

        metrics = ServerMetrics(name, speculative_positions(engine.config))
        loop = PipedEngineLoop(engine, commands, outputs, max_waiting=args.max_waiting, metrics=metrics)
    except Exception as err:  # the API process tells the user, as the command line would
        write_frame(outputs.fileno(), ("failed", str(err) if isinstance(err, ValueError) else
                                       f"{type(err).__name__}: {err}"))
        return
    write_frame(outputs.fileno(), ("ready", {"model_name": name, "max_model_len": engine.max_model_len,
                                             "tokenizer": tokenizer}))
    try:
        loop._run()  # on this (the only) thread, until "stop" or the API process goes
    except (BrokenPipeError, OSError):  # the API process is gone mid-send
        pass


# ------------------------------------------------------------------------------ API side
class EngineClient:
    """The API process's handle on the engine process (same surface as EngineLoop for the app)."""

    def __init__(self, args, timeout: float = START_TIMEOUT_S):
        """Start the engine process from the serve command line's `args` and wait until it is ready.
        Raises ValueError with the engine's own message if it could not be built."""
        context = multiprocessing.get_context("spawn")  # never fork: CUDA, and threads, forbid it
        command_reader, self._commands = context.Pipe(duplex=False)
        self._outputs, output_writer = context.Pipe(duplex=False)
        self.process = context.Process(target=engine_main, args=(command_reader, output_writer, args),
                                       name="course_lib-engine", daemon=True)
        self.process.start()
        command_reader.close()
        output_writer.close()
        self._streams: dict = {}  # request id -> [RequestStream, accepted?]
        self._calls: dict = {}  # call id -> future
        self._ids = itertools.count()
        self._reader_loop = None
        self._gone_reason: str | None = None
        # Commands go down the pipe without ever blocking this process: a write into a full pipe would
        # stop the event loop, which then could not read the output pipe, and an engine blocked on a
        # full output pipe would wait for it forever. What the pipe cannot take now waits in `_pending`
        # and goes when the pipe is writable again.
        self._fd = self._commands.fileno()
        os.set_blocking(self._fd, False)
        self._pending = bytearray()
        self._writer_loop = None
        self._inbox = bytearray()
        self._ready = False
        self.num_steps, self.busy_s = 0, 0.0
        try:
            if not self._outputs.poll(timeout):
                raise RuntimeError(f"the engine process did not start within {timeout:.0f} s")
            message = read_frame(self._outputs.fileno())  # still blocking: no event loop has watched it
        except EOFError:
            self.process.join(5)
            self.stop()
            raise RuntimeError(f"the engine process exited (code {self.process.exitcode}) before it was ready") \
                from None
        except Exception:
            self.stop()
            raise
        if message[0] == "failed":
            self.stop()
            raise ValueError(message[1])
        info = message[1]
        self._ready = True
        self.model_name, self.max_model_len, self.tokenizer = info["model_name"], info["max_model_len"], \
            info["tokenizer"]

    # -------------------------------------------------------------------- what the app uses
    @property
    def alive(self) -> bool:
        return self._gone_reason is None and self.process.is_alive()

    def add(self, stream, prompt_token_ids, params) -> None:
        self._attach()
        # [stream, accepted, samples whose finished delta is still to come (n / best_of > 1: several)]
        self._streams[stream.request_id] = [stream, False, params.num_samples]
        self._send(("add", stream.request_id, list(prompt_token_ids), params))

    def abort(self, request_id: str, reason: str | None = None) -> None:
        """End a request: its client left (`reason` None), or its answer is complete ("stop": a stop
        string), so the engine counts it as finished for that reason, with its latencies."""
        if self._streams.pop(request_id, None) is not None:
            self._send(("abort", request_id, reason))
        elif "#" in request_id and request_id.rpartition("#")[0] in self._streams:  # one sample (its stop string)
            self._send(("abort", request_id, reason))

    async def ask(self, action: str, *args):
        self._attach()
        if self._gone_reason is not None:
            raise RuntimeError(self._gone_reason)
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send(("ask", call_id, action, args))
        return await future

    def stop(self, timeout: float = 10.0) -> None:
        self._detach()
        if self._ready and self._gone_reason is None:  # say stop, after what is still pending
            try:  # never blocking: an engine that cannot take it now is terminated below instead
                os.write(self._fd, bytes(self._pending) + frame_bytes(("stop",)))
            except OSError:  # the pipe is full, or the engine process has gone already
                pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        try:
            self._gone("the server is shutting down")
        except RuntimeError:  # the event loop has closed: nobody is left to tell
            pass
        for conn in (self._commands, self._outputs):
            conn.close()

    # -------------------------------------------------------------------- the pipes
    def _attach(self) -> None:
        """Read the output pipe from the running event loop (the first handler's), by readiness: no
        reader thread takes the interpreter lock from the HTTP server at every step."""
        if self._reader_loop is None and self._gone_reason is None:
            self._reader_loop = asyncio.get_running_loop()
            self._reader_loop.add_reader(self._outputs.fileno(), self._readable)

    def _detach(self) -> None:
        for loop, remove, conn in ((self._reader_loop, "remove_reader", self._outputs),
                                   (self._writer_loop, "remove_writer", self._commands)):
            if loop is not None:
                try:
                    getattr(loop, remove)(conn.fileno())
                except (RuntimeError, ValueError, OSError):  # the loop (or the pipe) has closed already
                    pass
        self._reader_loop = self._writer_loop = None

    def _send(self, message) -> None:
        if self._gone_reason is None:
            self._pending += frame_bytes(message)
            self._write_pending()

    def _write_pending(self) -> None:
        try:
            written = os.write(self._fd, self._pending)
        except BlockingIOError:
            written = 0
        except OSError:  # the engine process is gone: the output pipe's EOF says so
            self._pending.clear()
            written = 0
        del self._pending[:written]
        if self._pending and self._writer_loop is None:
            self._writer_loop = asyncio.get_running_loop()
            self._writer_loop.add_writer(self._fd, self._write_pending)
        elif not self._pending and self._writer_loop is not None:
            self._writer_loop.remove_writer(self._fd)
            self._writer_loop = None

    def _readable(self) -> None:
        """Whatever has arrived (the loop made the pipe non-blocking): whole frames are handled, a
        frame's first part waits in `_inbox` for the rest."""
        try:
            data = os.read(self._outputs.fileno(), 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # end of file: the engine process is gone
            self.process.join(1)
            log.error("the engine process stopped (exit code %s)", self.process.exitcode)
            self._gone(f"the engine process stopped (exit code {self.process.exitcode})")
            return
        inbox = self._inbox
        inbox += data
        start = 0
        while len(inbox) - start >= 4:
            end = start + 4 + int.from_bytes(inbox[start:start + 4], "big")
            if len(inbox) < end:
                break
            self._handle(pickle.loads(inbox[start + 4:end]))
            start = end
        del inbox[:start]

    def _handle(self, message) -> None:
        if message[0] == "answer":
            _, call_id, ok, value = message
            future = self._calls.pop(call_id, None)
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    kind, text = value
                    future.set_exception(ValueError(text) if kind == "ValueError" else RuntimeError(text))
            return
        _, items, self.num_steps, self.busy_s = message
        streams = self._streams
        for request_id, item in items:
            entry = streams.get(request_id)
            if entry is None:
                continue  # aborted by its client in the meantime
            item = _decode(item)
            if item is ACCEPTED:
                entry[1] = True
            elif isinstance(item, APIError):
                del streams[request_id]
            elif item.finished:  # every sample ends with one finished delta (engine_loop.py)
                entry[2] -= 1
                if not entry[2]:
                    del streams[request_id]
            entry[0].put(item)

    def _gone(self, reason: str) -> None:
        """The engine process is gone: every waiting handler hears why, nobody waits forever."""
        if self._gone_reason is None:
            self._gone_reason = reason
        self._detach()
        self._pending.clear()
        for stream, accepted, _ in self._streams.values():
            stream.put(Delta([], True, "error", reason) if accepted else
                       APIError(reason, status=503, type="server_error", code="engine_down"))
        self._streams.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(RuntimeError(reason))
        self._calls.clear()
