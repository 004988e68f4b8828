"""`python -m course_lib SUBCOMMAND ...`: each subcommand lives in its own module's `main(argv)`."""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "generate": ("course_lib.cli.generate", "answer a prompt with the tiny model"),
    "simulate": ("course_lib.sim.cli", "serve a synthetic workload and report latency, throughput and KV waste"),
    "demo": ("course_lib.sim.demo", "the headline comparison at 100 users, with a table and plots"),
    "bench": ("course_lib.bench.cli", "benchmarks: `bench attention`, `bench engine`, `bench scheduler`"),
}

USAGE = "usage: python -m course_lib {" + ",".join(SUBCOMMANDS) + "} [options]\n\nsubcommands:\n" + "\n".join(
    f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()
) + "\n\nRun `python -m course_lib SUBCOMMAND --help` for the options of one."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
