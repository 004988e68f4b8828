"""`python -m course_lib bench {attention,engine,forward,scheduler,serve,grading} ...`: each benchmark is a module's `main(argv)`.

Benchmarks print ratios measured side by side in one run (a shared CPU moves both sides of a
ratio together); tests assert correctness only.
"""
from __future__ import annotations

import sys

from ..cli.router import route, usage

BENCHMARKS = {
    "attention": ("course_lib.bench.attention", "paged attention backends against each other"),
    "engine": ("course_lib.bench.engine",
               "course_lib's engine vs transformers (generate_batch, padded generate), same weights"),
    "forward": ("course_lib.bench.forward", "one engine step: the whole forward in C vs the PyTorch model"),
    "scheduler": ("course_lib.bench.scheduler", "scheduler + KV manager overhead per step, scripted runner, no model"),
    "serve": ("course_lib.bench.serve", "tokens/s streamed over HTTP (64 streams) vs LLMEngine.generate in process"),
    "grading": ("autograder.bench", "seconds per graded notebook (sandbox, cells, replay), a 1,600-notebook course"),
}
USAGE = usage("python -m course_lib bench", "benchmark", BENCHMARKS)


def main(argv: list[str] | None = None) -> int:
    return route("python -m course_lib bench", "benchmark", BENCHMARKS, argv)


if __name__ == "__main__":
    sys.exit(main())
