"""A command that hands its first argument to one of several modules' `main(argv)`.

Used twice: `python -m course_lib SUBCOMMAND` and `python -m course_lib bench BENCHMARK`.
Modules are imported only when chosen, so `--help` and the fast commands stay fast.
"""
from __future__ import annotations

import importlib
import sys


def usage(prog: str, kind: str, commands: dict[str, tuple[str, str]]) -> str:
    """`commands`: name -> (module, one-line help)."""
    lines = "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in commands.items())
    return (f"usage: {prog} {{{','.join(commands)}}} [options]\n\n{kind}s:\n{lines}\n\n"
            f"Run `{prog} {kind.upper()} --help` for the options of one.")


def route(prog: str, kind: str, commands: dict[str, tuple[str, str]], argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    text = usage(prog, kind, commands)
    if not argv or argv[0] in ("-h", "--help"):
        print(text)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"unknown {kind} {name!r}\n\n{text}", file=sys.stderr)
        return 2
    return importlib.import_module(commands[name][0]).main(rest) or 0
