"""Notebook 05, `run_closed_loop`: a scripted engine whose clock advances one per step, so that
"sent = min(num_requests, num_users + finished)" after every step is exact."""
from __future__ import annotations

import random

from autograder import fixtures
from autograder._checking import broke, call, check, expect, forbid_calls, kind_of, plain_int, show
from course_lib import EngineConfig, LLMEngine, SamplingParams


def _loop_modules():
    import course_lib.sim.closed_loop as closed_loop
    import course_lib.sim.simulate as simulate

    return [closed_loop, simulate]


def _loop_functions():
    import course_lib.sim.closed_loop as closed_loop

    return (closed_loop.run_closed_loop,)


def _make_prompt(vocab):
    def make_prompt(rng):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 10))]
        return prompt, SamplingParams(max_tokens=rng.randint(1, 9))

    return make_prompt


IDLE_STEPS = 50  # engine.step() calls with nothing left to serve before the loop counts as endless


class _LoopWatch:
    """The engine handed to the student's loop, watched by the check: each request as it entered
    (through engine.add_request: its prompt, and how many engine steps had run by then) and each
    request's finished output as the engine's own step() returned it (the step that finished it, its
    tokens). The student's code can reach the engine's requests and rewrite their fields (arrival and
    finish times, status, tokens); it cannot reach this, so the verdict reads this.

    It also stops an endless loop at once (instead of at the grader's time limit): a loop that keeps
    stepping an engine with nothing left to serve would never end."""

    def __init__(self, engine, shown):
        self.steps = 0
        self.sent: list[tuple[str, list, int]] = []  # (request id, prompt, steps run before it entered)
        self.finished: dict[str, tuple[int, list]] = {}  # request id -> (its finishing step, its tokens)
        add_request, step, idle = engine.add_request, engine.step, [0]

        def add_and_note(*args, **kwargs):
            rid = add_request(*args, **kwargs)
            self.sent.append((rid, list(engine.requests[rid].prompt_token_ids), self.steps))
            return rid

        def step_and_note():
            idle[0] = 0 if engine.has_unfinished_requests else idle[0] + 1
            if idle[0] > IDLE_STEPS:
                broke("finished, in sent order",
                      f"{shown} called engine.step() {IDLE_STEPS} times in a row with no request left to serve "
                     f"({len(engine.requests)} sent, all finished): the loop never ends. Stop when all num_requests "
                     "requests have finished (the check's cap)")
            outputs = step()
            self.steps += 1
            for out in outputs:
                if out.finished and out.request_id not in self.finished:
                    self.finished[out.request_id] = (self.steps, list(out.token_ids))
            return outputs

        engine.add_request, engine.step = add_and_note, step_and_note


def _int_list(value):
    """`value` (a list or tuple of plain ints) as a list of ints, or None."""
    if type(value) not in (list, tuple):
        return None
    ints = [plain_int(x) for x in value]
    return None if any(x is None for x in ints) else ints


def _closed_loop_case(impl, num_users, num_requests, seed, allow_reference, max_num_seqs=None):
    mc = fixtures.scripted_model_config()
    engines, watches, prompts_made = [], [], []
    inner = _make_prompt(mc.vocab_size)

    def make_engine():
        engine = LLMEngine(mc, EngineConfig(page_size=4, num_pages=max(400, 6 * (num_users + 2)),
                                            max_num_seqs=max_num_seqs or num_users + 2, max_num_batched_tokens=512,
                                            admission="none"), clock=fixtures.StepClock())
        engines.append(engine)
        watches.append(_LoopWatch(engine, shown))
        return engine

    def make_prompt(rng):
        expect(isinstance(rng, random.Random), f"make_prompt must be called with rng = random.Random(seed), got "
                                               f"{type(rng).__name__}", rule="one engine, one rng")
        result = inner(rng)
        prompts_made.append(result)
        return result

    shown = f"run_closed_loop(make_engine, num_users={num_users}, num_requests={num_requests}, make_prompt, seed={seed})"
    if max_num_seqs:
        shown += f" on a server with only {max_num_seqs} seats (requests queue there)"
    with forbid_calls("run_closed_loop", _loop_modules(), enabled=not allow_reference):
        results = call(shown, impl, make_engine, num_users, num_requests, make_prompt, seed)
    expect(len(engines) == 1, f"{shown} called make_engine() {len(engines)} times: build one engine and serve every "
                              "request on it", rule="one engine, one rng")
    engine, watch = engines[0], watches[0]
    expect(len(prompts_made) == num_requests,
           f"{shown} called make_prompt {len(prompts_made)} times: it must send exactly num_requests={num_requests} requests",
           rule="one engine, one rng")
    rng = random.Random(seed)
    expected = [inner(rng) for _ in range(num_requests)]
    # What the check saw enter and finish, never the engine's requests (your code can rewrite those).
    seen = {rid for rid, _, _ in watch.sent}
    unseen = [rid for rid in engine.requests if rid not in seen]
    expect(not unseen, f"{shown}: requests {unseen[:5]} are in the engine but did not enter through the "
                       "engine.add_request the check handed you: send every request with engine.add_request",
           rule="one engine, one rng")
    sent = watch.sent
    expect(len(sent) == num_requests, f"{shown} added {len(sent)} requests to the engine, expected {num_requests}",
           rule="one engine, one rng")
    for k, ((rid, prompt_sent, _), (prompt, params)) in enumerate(zip(sent, expected)):
        if prompt_sent != prompt:
            same = all(p == sent[0][1] for _, p, _ in sent)
            broke("one engine, one rng", f"{shown}: request {k} has prompt {prompt_sent}, but the {k}-th make_prompt draw from "
                 f"random.Random({seed}) is {prompt}: "
                 + ("every request got the same prompt, so a new rng was created per request; "
                    if same else "")
                 + "create rng = random.Random(seed) ONCE and pass it to every make_prompt(rng) call, and send "
                   "each prompt with the SamplingParams make_prompt returned")
    unfinished = [rid for rid, _, _ in sent if rid not in watch.finished]
    elsewhere = [rid for rid in unfinished if engine.requests[rid].is_finished]
    expect(not elsewhere, f"{shown}: requests {elsewhere[:5]} look finished, but no engine.step() the check handed "
                          "you finished them: serve the requests by stepping the engine (engine.step()), and leave "
                          "their fields to the engine", rule="one engine, one rng")
    expect(not unfinished, f"{shown} returned while requests {unfinished[:5]} were unfinished: run until all "
                           f"{num_requests} are done", rule="finished, in sent order")
    # The closed loop, as an equation over the engine's steps (the step clock's times).
    arrivals = sorted(steps for _, _, steps in sent)
    finishes = sorted(watch.finished[rid][0] for rid, _, _ in sent)
    for t in range(int(max(finishes)) + 1):
        a = sum(1 for x in arrivals if x <= t)
        f = sum(1 for x in finishes if x <= t)
        want = min(num_requests, num_users + f)
        if a == want:
            continue
        if t == 0 and a > num_users:
            broke("send when answered", f"{shown}: {a} requests were sent at the start, but only num_users={num_users} users exist and "
                 "each waits for its answer before sending again (this is a closed loop, not all-at-once)")
        if a > want:
            broke("send when answered", f"{shown}: at step {t}, {a} requests had been sent but only {f} had finished: more than "
                 f"num_users={num_users} were outstanding")
        broke("the server queues" if max_num_seqs and max_num_seqs < num_users else "send when answered",
              f"{shown}: after step {t}, {f} requests had finished but only {a} had been sent (expected {want}): "
             "when a request finishes, its user sends the next one right away, before the engine's next step "
             "(for every request that finished in that step), whether or not the server has a free seat: "
             "the server queues it (first come, first served), and that wait is part of its TTFT")
    # The returned outputs: the finished outputs the engine's steps returned, in the order the requests were sent.
    expect(type(results) in (list, tuple) and len(results) == num_requests,
           lambda: f"{shown} must return a list of {num_requests} RequestOutputs, got {kind_of(results)}"
                   + (f" of length {len(results)}" if type(results) in (list, tuple) else ""),
           rule="finished, in sent order")
    for k, (out, (rid, _, _), (prompt, params)) in enumerate(zip(results, sent, expected)):
        expect(hasattr(out, "token_ids") and hasattr(out, "prompt_token_ids"),
               lambda: f"{shown}: item {k} must be a RequestOutput (what engine.step() returns), got {kind_of(out)}",
               rule="finished, in sent order")
        prompt_ids, tokens = _int_list(out.prompt_token_ids), _int_list(out.token_ids)
        if prompt_ids != prompt:
            broke("finished, in sent order", f"{shown}: item {k} of the result is not the {k}-th request sent (prompt {show(prompt_ids)} "
                 f"instead of {prompt}): return the outputs in the order the requests were sent")
        finished = out.finished
        want_tokens = watch.finished[rid][1]
        expect(finished is True and tokens is not None and len(tokens) == params.max_tokens,
               lambda: f"{shown}: item {k} should be the finished output with {params.max_tokens} tokens, got "
                       f"finished={show(finished)} with {len(tokens) if tokens is not None else show(out.token_ids)} "
                       "tokens: keep the output from the step where it finished", rule="finished, in sent order")
        expect(tokens == want_tokens,
               lambda: f"{shown}: item {k} holds the tokens {tokens}, but the engine's step that finished request "
                       f"{rid} returned {want_tokens}: return the RequestOutputs engine.step() gave you, as they were",
               rule="finished, in sent order")


@check("run_closed_loop", forbidden=_loop_functions)
def check_run_closed_loop(impl, seed, allow_reference):
    rng = random.Random(seed)
    num_users = rng.randint(3, 5)
    _closed_loop_case(impl, num_users, rng.randint(10, 16), seed, allow_reference)
    _closed_loop_case(impl, 4, 3, seed + 1, allow_reference)  # fewer requests than users
    _closed_loop_case(impl, 1, rng.randint(3, 5), seed + 3, allow_reference)  # one user: strictly one at a time
    _closed_loop_case(impl, rng.randint(4, 6), rng.randint(10, 14), seed + 2, allow_reference,
                      max_num_seqs=2)  # fewer seats than users: a queue on the server
    # More than 256 requests: counts compared with `is` / `is not` (identity, not value) break past
    # CPython's small-int cache.
    _closed_loop_case(impl, 260, 270, seed + 4, allow_reference)
