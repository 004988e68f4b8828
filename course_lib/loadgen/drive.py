"""Drive an endpoint with a workload: closed-loop users or open-loop arrivals, all streaming.

The workloads are the simulator's (`course_lib.sim.workload`), fitted to the server exactly as
`simulate` fits them: a prompt longer than `max_model_len - 1` is cut to that, an answer is cut
to the room left and to `max_tokens`. Prompts are token ids (`make_prompt_tokens`, the same ids
`simulate` uses), sent as a token-id list (vLLM and SGLang accept those too); each request asks
for exactly its answer length (`max_tokens` = the workload's output length, `ignore_eos`).

Closed loop: each user sends its next request when its answer is complete (plus think time),
as `ClosedLoopUsers.on_finish` says. Open loop: every request is sent at its arrival time,
whether or not the server keeps up.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from course_lib.sim.workload import ClosedLoopUsers, RequestSpec, make_prompt_tokens

from .client import Record, completion_payload, new_session, run_async, stream_completion
from .scrape import MetricsSampler

DEFAULT_VOCAB_SIZE = 47  # the tiny model's: ids 3..46 are characters, valid for any larger vocabulary too


@dataclasses.dataclass
class LoadTarget:
    """Where to send and what the server can hold."""

    url: str  # base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)
    model: str | None = None
    max_model_len: int = 2048
    max_tokens: int = 512  # per-request cap on the answer
    vocab_size: int = DEFAULT_VOCAB_SIZE
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 600.0
    return_token_ids: bool = False
    scrape_metrics: bool = True  # sample the server's /metrics (peak running, preemptions, prefix hits)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")

    @property
    def completions_url(self) -> str:
        return self.base_url + "/v1/completions"


def fit_spec(spec: RequestSpec, max_model_len: int, max_tokens: int) -> tuple[RequestSpec, bool]:
    """The spec as served (simulate's clipping rule) and whether it had to be clipped."""
    prompt_len = min(spec.prompt_len, max_model_len - 1)
    cap = max(1, min(max_tokens, max_model_len - prompt_len))
    output_len = max(1, min(spec.output_len, cap))
    served = dataclasses.replace(spec, prompt_len=prompt_len, output_len=output_len,
                                 shared_prefix_len=min(spec.shared_prefix_len, prompt_len))
    return served, (prompt_len, output_len) != (spec.prompt_len, spec.output_len)


async def run_load_async(target: LoadTarget, workload, progress: bool = True, client=None) -> dict:
    """Serve `workload` (ClosedLoopUsers, or RequestSpecs with arrival times) through `target`.
    Returns {"records": [Record...] in issue order, "specs": served specs, "clipped": n, "wall_s": s,
    "server": what /metrics said (peak running, preemptions, prefix hit rate; None where unknown)}."""
    closed = isinstance(workload, ClosedLoopUsers)
    initial = workload.initial() if closed else list(workload)
    total = workload.num_requests if closed else len(initial)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else None
    own_client = client is None
    if own_client:
        client = new_session(target.timeout_s)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="load", unit="req", mininterval=0.5, leave=False)
    records: list[Record] = []
    specs: list[RequestSpec] = []
    clipped = 0
    tasks: set = set()
    t0 = time.perf_counter()

    async def one(spec: RequestSpec) -> None:
        nonlocal clipped
        delay = (spec.arrival_time or 0.0) - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        served, was_clipped = fit_spec(spec, target.max_model_len, target.max_tokens)
        clipped += was_clipped
        prompt = make_prompt_tokens(served, target.vocab_size, seed=target.seed)
        record = Record(spec.request_id, len(prompt), served.output_len)
        records.append(record)
        specs.append(served)
        body = completion_payload(target.model, prompt, served.output_len, return_token_ids=target.return_token_ids)
        await stream_completion(client, target.completions_url, body, record, t0, headers)
        if bar is not None:
            bar.update(1)
        if closed:
            nxt = workload.on_finish(spec, record.finish_time)
            if nxt is not None:
                start(nxt)

    def start(spec: RequestSpec) -> None:
        task = asyncio.ensure_future(one(spec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    sampler = MetricsSampler(client, target.base_url + "/metrics", headers=headers) if target.scrape_metrics else None
    server = {"peak_running": None, "preemptions": None, "prefix_hit_rate": None}
    try:
        if sampler is not None:
            await sampler._sample()  # the counters' starting values
            sampler.start()
        for spec in initial:
            start(spec)
        while tasks:
            await asyncio.gather(*list(tasks))
        if sampler is not None:
            server = await sampler.stop()
    finally:
        if sampler is not None and sampler._task is not None:
            sampler._task.cancel()
        if bar is not None:
            bar.close()
        if own_client:
            await client.close()
    return {"records": records, "specs": specs, "clipped": clipped, "wall_s": time.perf_counter() - t0,
            "server": server, "num_requests": total}


def run_load(target: LoadTarget, workload, progress: bool = True) -> dict:
    """`run_load_async` from synchronous code (in a Jupyter kernel too: it runs on its own thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_async(run_load_async(target, workload, progress))
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a notebook's loop is already running
        return pool.submit(run_async, run_load_async(target, workload, progress)).result()

