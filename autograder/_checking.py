"""What every check shares: failing with a useful message, refusing the reference, calling
student code safely, and watching what it calls.

A check is a plain function `check_<adapter>(impl, seed=0)` wrapped by `@check(...)`, which:

- refuses `impl` when it is (or is built from) course_lib's / the autograder's own implementation,
  unless the private flag `_allow_reference=True` is given (tests/test_autograder_checks.py only);
- runs the body with warnings silenced (nbgrader counts stderr output as a failure), one torch
  thread (fast and deterministic on small tensors) and the caller's RNG state preserved;
- turns an unexpected exception (a missing method, a wrong return type) into an AssertionError
  that says which adapter and what went wrong, and where in the student's code it was raised.

Checks never use the `assert` statement: it vanishes under `python -O`.

The pieces every check uses live in one module each, and the checks import them all from here:
failing (`check_failures`), values and their comparison (`check_values`), refusing the reference
(`reference_refusal`), watching what the student's code calls and runs (`check_hooks`), and which
code is the student's (`user_code`). This module holds the decorator and the engine-driving helpers.
"""
from __future__ import annotations

import contextlib
import functools
import warnings

# Re-exported: the checks, the record and the tests import every helper from this one module.
from .check_failures import (_AssertionError, broke, call, collecting_failures, describe_exception,  # noqa: F401
                             expect, fail, same_float)
from .check_hooks import _fill_counter, _fill_list, _hooked, count_user_lines, forbid_calls, watch_calls  # noqa: F401
from .check_values import (difference, expect_unchanged, is_tensor, kind_of, plain_float, plain_int,  # noqa: F401
                           pristine, show)
from .reference_refusal import AUTOGRADER_REFERENCE_MESSAGE, REFERENCE_MESSAGE, reject_reference  # noqa: F401
from .user_code import is_user_file  # noqa: F401


@contextlib.contextmanager
def check_environment():
    """Warnings off, one torch thread, the caller's RNG state preserved."""
    import torch

    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                yield
        finally:
            torch.set_num_threads(threads)


def check(name: str, forbidden=lambda: (), allowed_bases=lambda: ()):
    """Wrap `body(impl, seed, allow_reference)` into `check_<name>(impl, seed=0)`.
    `forbidden` / `allowed_bases` are thunks so that importing a check module stays cheap."""

    def decorate(body):
        def refuse(raw):
            reject_reference(name, raw, forbidden(), allowed_bases())

        @functools.wraps(body)
        def wrapper(impl, seed: int = 0, *, _allow_reference: bool = False):
            if impl is None:
                fail(f"{name} is None: define it in the solution cell above (and run that cell)")
            if not isinstance(seed, int):
                fail(f"seed must be an int, got {seed!r}")
            if not _allow_reference:
                from .record import through_membrane

                handled = through_membrane(name, impl, seed, refuse, run, fail=fail,
                                           describe_exception=describe_exception, is_user_file=is_user_file)
                if handled:
                    return None
                reject_reference(name, impl, forbidden(), allowed_bases())
            run(impl, seed, _allow_reference)
            return None  # never a value: nbgrader would read a number as partial credit

        def run(impl, seed, _allow_reference=False):
            with collecting_failures() as failures:
                with check_environment():
                    try:
                        body(impl, seed, _allow_reference)
                    except (NotImplementedError, _AssertionError):
                        raise
                    except Exception as exc:  # noqa: BLE001
                        fail(f"{name}: {describe_exception(exc)}")
                if failures:  # the body went on: the failure was caught on its way through the student's code
                    raise _AssertionError(f"{failures[0]} (your code caught this failure of the check and went "
                                          "on; a failure of the check stands whatever your code does with it)")

        wrapper.exercise = name
        wrapper.run_body = run
        return wrapper

    return decorate


OUT_OF_PAGES = (None, "The pool ran out of pages: before allocating, make room (the scheduler preempts the youngest "
                      "request with self._make_room) or check kv.can_allocate.")
STALLED = (None, ": requests are being lost or never retired")


def drive(engine, who: str, max_steps: int = 2000, on_step=None, *, out_of_pages=OUT_OF_PAGES,
          stalled=STALLED) -> None:
    """Step `engine` until every request is finished, calling `on_step(engine)` after each step; an engine
    error, or requests still unfinished after `max_steps` steps (a request starved or never retired: it
    fails within a second instead of hanging), is a failure. `out_of_pages` and `stalled` are (rule, words):
    the rule the failure names (None: none) and what it adds when the pool ran out of pages, or for a stall."""
    for step in range(max_steps):
        if not engine.has_unfinished_requests:
            return
        try:
            engine.step()
        except (NotImplementedError, _AssertionError):
            raise
        except Exception as exc:  # noqa: BLE001 - the engine failed under the student's decisions
            failed = f"{who}: the engine failed mid-run (step {step}) with {describe_exception(exc)}"
            if type(exc).__name__ == "OutOfPages":
                rule, hint = out_of_pages
                expect(False, f"{failed}. {hint}", rule=rule)
            fail(failed)
        if on_step is not None:
            on_step(engine)
    stuck = [r.request_id for r in engine.requests.values() if not r.is_finished]
    rule, why = stalled
    expect(False, f"{who}: {len(stuck)} request(s) ({', '.join(stuck[:5])}) were still unfinished after {max_steps} "
                  f"engine steps{why}", rule=rule)


@contextlib.contextmanager
def naming_rule(name: str):
    """A failure inside the block that names no rule yet names `name` (the rule of the case the block
    runs), so that a crash of the student's code in that case still says which rule to open. A refusal
    of course_lib's code passes unchanged: it is not a broken rule (so it may stand inside `forbid_calls`
    or around it)."""
    try:
        yield
    except _AssertionError as exc:
        text = str(exc)
        if text.startswith('Rule "') or REFERENCE_MESSAGE in text or AUTOGRADER_REFERENCE_MESSAGE in text:
            raise
        broke(name, text)


def expect_greedy_answers(engine, want, explain, rule: str | None = None) -> None:
    """Every request `r<i>` of `engine` produced `want[i]` (the model's greedy answer, computed by the check
    without the student's piece); else fail with `explain(i, got, wanted)`: what a difference means here."""
    for i, wanted in enumerate(want):
        got = engine.requests[f"r{i}"].output_token_ids
        expect(got == wanted, lambda: explain(i, got, wanted), rule=rule)  # noqa: B023 - called at once


class RunnerLedger:
    """What the engine's own runner did, kept by the check: every token it sampled for each request,
    in order, and every preemption in the scheduler outputs it executed.

    A student's piece plugged into the engine is handed the engine's requests (and its kv manager),
    so it can rewrite a request's output list, status or counters; the runner it is never handed.
    The verdict therefore holds the requests to this ledger (`expect_requests_match`): a request
    made to look finished, or given tokens the model never produced, fails."""

    def __init__(self, engine):
        self.tokens: dict[str, list[int]] = {}
        self.preempted: dict[str, int] = {}
        execute = engine.runner.execute

        def execute_and_note(out):
            for rid in out.preempted:
                if type(rid) is str:
                    self.preempted[rid] = self.preempted.get(rid, 0) + 1
            sampled = execute(out)
            for rid, token in sampled.items():  # before the scheduler's update sees (and could change) them
                self.tokens.setdefault(rid, []).append(int(token))
            return sampled

        engine.runner.execute = execute_and_note

    def expect_requests_match(self, engine, who: str, preemptions: bool = False) -> None:
        """Every request's output tokens (and, if asked, its preemption count) are the ledger's."""
        for rid, request in engine.requests.items():
            want = self.tokens.get(rid, [])
            found = difference(request.output_token_ids, want, "its output_token_ids")
            if found:
                fail(f"{who}: request {rid}: {found.replace(' expected ', ' but the engine produced ', 1)} "
                     f"({len(want)} token(s) sampled by the engine's model for it): a request's tokens come only "
                     "from the engine's steps; your code must not change a request's output list, status or "
                     "counters itself")
            if preemptions:
                n = self.preempted.get(rid, 0)
                expect(type(request.num_preemptions) is int and request.num_preemptions == n,
                       lambda: f"{who}: request {rid} counts {show(request.num_preemptions)} preemption(s), but the "
                               f"scheduler's outputs preempted it {n} time(s): a preemption is counted once, by the "
                               "scheduler that makes it; your code must not change a request's counters itself")
