"""Closed-loop users on the scripted runner and the simulated clock, served by an engine built with
policy *objects* (an admission policy, a scheduler class) instead of the names `simulate` takes:
notebook 7 ranks a student's own admission policy and victim choice next to course_lib's on the
same workload. Deterministic: the same arguments give the same numbers on any machine."""
from __future__ import annotations

import dataclasses

from course_lib.engine import LLMEngine, RequestOutput
from course_lib.engine_config import EngineConfig
from course_lib.scheduler.sampling import SamplingParams
from course_lib.sim.clock import SimulatedClock
from course_lib.sim.metrics import summarize
from course_lib.sim.simulate import DEFAULT_SIM_MAX_MODEL_LEN, scripted_model_config
from course_lib.sim.workload import ClosedLoopUsers, make_prompt_tokens


def serve_users(config: EngineConfig, users: int, num_requests: int, *, max_tokens: int, seed: int = 0,
                admission=None, scheduler=None, max_steps: int = 200_000, slo: dict | None = None):
    """Serve `num_requests` of the default chat-like workload from `users` closed-loop users.

    `admission`: a policy object (`can_admit(...)`), else the config's named one; `scheduler`: a
    scheduler class, else course_lib's. A request larger than the whole pool is recorded as failed
    (refused at the door). Returns (summary dict, request records, step stats); `slo` (keys
    `ttft_slo_s`, `tpot_slo_s`, `latency_slo_s`) sets what the summary's goodput counts."""
    max_len = config.max_model_len or DEFAULT_SIM_MAX_MODEL_LEN
    model = scripted_model_config(max_len)
    engine = LLMEngine(model, config, admission=admission, scheduler=scheduler,
                       clock=SimulatedClock("H100", "llama-3-8b"))
    workload = ClosedLoopUsers(users, num_requests, seed=seed)
    reserved = sorted({0, 1, 2, *engine.model_config.eos_token_ids})
    records, pending = {}, list(workload.initial())

    def send(spec):
        prompt_len = min(spec.prompt_len, max_len - 1)
        cap = max(1, min(max_tokens, max_len - prompt_len))
        out_len = max(1, min(spec.output_len, cap))
        spec = dataclasses.replace(spec, prompt_len=prompt_len, output_len=out_len, shared_prefix_len=0)
        prompt = make_prompt_tokens(spec, model.vocab_size, seed=seed, reserved_ids=reserved)
        try:
            engine.add_request(prompt, SamplingParams(max_tokens=cap), request_id=spec.request_id,
                               arrival_time=spec.arrival_time, scripted_output_len=out_len)
        except ValueError as err:  # larger than the whole pool: refused at the door
            t = engine.clock.now()
            records[spec.request_id] = RequestOutput(spec.request_id, prompt, [], True, "error", str(err),
                                                     arrival_time=t, finish_time=t)
            nxt = workload.on_finish(spec, t)
            if nxt is not None:
                pending.append(nxt)

    while pending or engine.has_unfinished_requests:
        while pending:
            send(pending.pop(0))
        if not engine.has_unfinished_requests:
            continue
        if len(engine.step_stats) >= max_steps:
            raise RuntimeError(f"serve_users: still unfinished after {max_steps} engine steps (the cap): the policy "
                               "never lets the waiting requests in, or the running ones never finish")
        for out in engine.step():
            if out.finished and out.request_id not in records:
                records[out.request_id] = out
                nxt = workload.on_finish(_Spec(out.request_id), out.finish_time)
                if nxt is not None:
                    pending.append(nxt)
    ordered = sorted(records.values(), key=lambda r: int(r.request_id[1:]))
    return summarize(ordered, engine.step_stats, **(slo or {})), ordered, engine.step_stats


class _Spec:
    """What ClosedLoopUsers.on_finish reads of a finished request: its id."""

    def __init__(self, request_id):
        self.request_id = request_id
