"""`python -m course_lib bench {attention,engine,scheduler} ...`: each benchmark is a module's `main(argv)`.

Benchmarks print ratios measured side by side in one run (a shared CPU moves both sides of a
ratio together); tests assert correctness only.
"""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "attention": ("course_lib.bench.attention", "paged attention backends against each other"),
    "engine": ("course_lib.bench.engine",
               "course_lib's engine vs transformers (generate_batch, padded generate), same weights"),
    "scheduler": ("course_lib.bench.scheduler", "scheduler + KV manager overhead per step, scripted runner, no model"),
}

USAGE = "usage: python -m course_lib bench {" + ",".join(BENCHMARKS) + "} [options]\n\nbenchmarks:\n" + "\n".join(
    f"  {name:<10} {help_}" for name, (_, help_) in BENCHMARKS.items()
) + "\n\nRun `python -m course_lib bench BENCHMARK --help` for the options of one."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(BENCHMARKS[name][0])
    except ModuleNotFoundError as err:
        if err.name != BENCHMARKS[name][0]:
            raise
        print(f"benchmark {name!r} is not installed yet ({BENCHMARKS[name][0]} is missing)", file=sys.stderr)
        return 2
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
