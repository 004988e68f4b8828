"""What the server tests share: a bounded wait, the in-process answer to compare with, and the
server's engine process."""
from __future__ import annotations

import time

from course_lib import EngineConfig, LLMEngine, SamplingParams


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def in_process(tiny, text: str, max_tokens: int, ignore_eos: bool = False) -> list[int]:
    """The greedy answer the engine gives in this process (what every server must send back)."""
    model, tokenizer = tiny
    (out,) = LLMEngine(model, EngineConfig()).generate(
        [tokenizer.encode_prompt(text)], SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))
    return out.token_ids


def engine_process_of(server_pid: int) -> int:
    """A `serve` process's engine process: its child that is not multiprocessing's resource tracker
    (Linux: reads /proc)."""
    children = open(f"/proc/{server_pid}/task/{server_pid}/children").read().split()
    engines = [int(c) for c in children if b"resource_tracker" not in open(f"/proc/{c}/cmdline", "rb").read()]
    assert len(engines) == 1, f"expected one engine process among the server's children {children}"
    return engines[0]
