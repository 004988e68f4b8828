"""`python -m course_lib SUBCOMMAND ...`: each subcommand lives in its own module's `main(argv)`."""
from __future__ import annotations

import sys

from course_lib.cli.router import route, usage

SUBCOMMANDS = {
    "generate": ("course_lib.cli.generate", "answer a prompt with the tiny model"),
    "simulate": ("course_lib.sim.cli", "serve a synthetic workload and report latency, throughput and KV waste"),
    "demo": ("course_lib.sim.demo", "the headline comparison at 100 users, with a table and plots"),
    "bench": ("course_lib.bench.cli", "benchmarks: `bench attention`, `bench engine`, `bench scheduler`"),
    "serve": ("course_lib.serve.cli", "an OpenAI-compatible server with a live dashboard (/dashboard)"),
    "load": ("course_lib.loadgen.cli", "drive any OpenAI-compatible endpoint with the simulator's workloads"),
}
USAGE = usage("python -m course_lib", "subcommand", SUBCOMMANDS)


def main(argv: list[str] | None = None) -> int:
    return route("python -m course_lib", "subcommand", SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
