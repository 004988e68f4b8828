"""`python -m autograder mutate [--exercise X]`: mutation testing of the checks.

Hand-written mutants (autograder/mutants/) test the bugs their authors thought of; this tests
the ones nobody thought of. cosmic-ray (a maintained mutation tool) generates every mutant of
an exercise's reference solution: each of its core operators (replace `+` by `-`, `<` by `<=`,
`True` by `False`, a number by a neighbour, `break` by `continue`, a loop by zero iterations,
...) applied at each place it fits, inside the exercise's own definition (the adapter's function
or class in the generated `autograder/reference/<module>.py`). Each mutant is compiled into a
fresh module and graded by the exercise's check on every graded seed (`Exercise.graded_seeds`):

- **killed**: the check failed on some seed (or the mutant crashed, or ran past the time limit);
- **survived**: it passed every seed. A survivor is either a gap in the check, or *equivalent*
  (it computes the same thing, e.g. `<` -> `!=` on a counter that only grows). Equivalent
  survivors are listed, each with a one-line reason, in
  `autograder/mutation_equivalents/<notebook module>.json` (one file per notebook) and reported apart; the goal is >= 95% of the others killed for every exercise.

Each mutant runs in a child forked from the command's process (torch and the checks imported once),
`--jobs` at a time (default: the cores); an alarm (`--timeout`) stops an infinite loop, and a child
that dies (a Triton kernel writing out of bounds) or hangs outside Python counts as killed.
For the Triton exercise the kernel the student completes is mutated too, and the interpreter is
given the mutated source.
Writes a JSON report (`--json`) and prints a markdown table (docs/grading.md keeps the latest).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import linecache
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .exercises import BY_ADAPTER, EXERCISES, Exercise

HERE = Path(__file__).resolve().parent
EQUIVALENTS = HERE / "mutation_equivalents"  # one JSON list of {"key", "reason"} per notebook module
DEFAULT_TIMEOUT = 30.0
# What is mutated: the adapter's definition, and for the Triton exercise also the kernel the student
# completes (the adapter there is the given wrapper that launches it).
EXTRA_TARGETS = {"paged_attention_triton": ("paged_decode_kernel",)}
# Operators that take arguments (variable replacer / inserter) need a hand-picked pair of names
# per site; the argument-free core operators cover the realistic slips.


@dataclass(frozen=True)
class Mutant:
    exercise: str
    operator: str
    occurrence: int  # cosmic-ray's index of this operator's sites in the module
    line: int  # 1-based line of the mutated site
    original: str  # that line, stripped: the key an equivalence note refers to
    mutated: str  # the same line after the mutation, stripped

    @property
    def key(self) -> str:
        return f"{self.exercise}|{self.operator}|{self.original}|{self.mutated}"


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # "killed" | "survived" | "equivalent"
    detail: str  # the check's message (killed), the equivalence reason, or ""
    seconds: float


# ------------------------------------------------------------------------------- generation
def reference_path(exercise: Exercise) -> Path:
    return HERE / "reference" / f"{exercise.module}.py"


def _definition_span(source: str, name: str) -> tuple[int, int]:
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node.lineno, node.end_lineno
    raise SystemExit(f"{name} is not defined at the top level of its reference module: regenerate it "
                     "(python scripts/extract_references.py)")


def _operators():
    import cosmic_ray.plugins

    for name in sorted(cosmic_ray.plugins.operator_names()):
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():
            yield name, cls()


def targets(exercise: Exercise) -> tuple[str, ...]:
    """The top-level definitions of the reference module that the student writes for this exercise."""
    return (exercise.adapter, *EXTRA_TARGETS.get(exercise.adapter, ()))


def generate(exercise: Exercise) -> list[tuple[Mutant, str]]:
    """Every (mutant, mutated module source) cosmic-ray makes inside the exercise's definitions;
    mutants whose code is identical to another's (two operators, one result) are kept once."""
    source = reference_path(exercise).read_text(encoding="utf-8")
    seen: set[str] = set()
    out = []
    for name in targets(exercise):
        out += _generate_in(exercise, source, name, seen)
    return out


def _generate_in(exercise: Exercise, source: str, name: str, seen: set[str]) -> list[tuple[Mutant, str]]:
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.mutating import mutate_code

    lines = source.splitlines(keepends=True)
    first, last = _definition_span(source, name)
    # cosmic-ray re-parses what it mutates for every mutant: hand it the definition alone (a
    # top-level def or class parses by itself) and splice each result back into the module.
    before, definition, after = "".join(lines[:first - 1]), "".join(lines[first - 1:last]), "".join(lines[last:])
    out = []
    nodes = list(ast_nodes(get_ast(definition)))  # parsed once: finding positions does not change the tree
    for op_name, operator in _operators():
        positions = [start for node in nodes for start, _ in operator.mutation_positions(node)]
        for occurrence, (line, _col) in enumerate(positions):
            mutated_definition = mutate_code(definition, operator, occurrence)
            if mutated_definition is None or mutated_definition == definition:
                continue
            mutated = before + mutated_definition + after
            if mutated in seen:
                continue
            seen.add(mutated)
            mutated_lines = mutated_definition.splitlines()
            changed = mutated_lines[line - 1].strip() if line - 1 < len(mutated_lines) else ""
            out.append((Mutant(exercise.adapter, op_name.split("/")[-1], occurrence, first - 1 + line,
                               lines[first - 2 + line].strip(), changed), mutated))
    return out


# ------------------------------------------------------------------------------- evaluation
class _Timeout(BaseException):
    """Raised by the alarm: a BaseException, so a mutant's `except Exception` cannot swallow it."""


def _on_alarm(signum, frame):
    raise _Timeout()


def _evaluate(job) -> tuple[str, str, float]:
    """In a worker: compile the mutated module, grade its adapter on every graded seed."""
    adapter, source, timeout = job
    exercise = BY_ADAPTER[adapter]
    from autograder.checks import get_check

    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        namespace = {"__name__": f"autograder.reference.{exercise.module}_mutant"}
        # Compiled under the reference's own file name: the checks count that folder as student code.
        # Triton's interpreter re-reads a kernel's source through linecache: make it the mutant's, not
        # the file on disk (a mutated kernel would otherwise run unmutated).
        path = str(reference_path(exercise))
        linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
        exec(compile(source, path, "exec"), namespace)
        impl = namespace[adapter]
        check = get_check(adapter)
        for seed in exercise.graded_seeds:
            check(impl, seed, _allow_reference=True)
    except _Timeout:
        return "killed", f"ran past {timeout:g} s", time.perf_counter() - start
    except AssertionError as e:
        return "killed", str(e).splitlines()[0][:300] if str(e) else "AssertionError", time.perf_counter() - start
    except BaseException as e:  # noqa: BLE001 - a crash, NotImplementedError, SystemExit: all kill it
        return "killed", f"{type(e).__name__}: {e}"[:300], time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return "survived", "", time.perf_counter() - start


def _worker_init():
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def load_equivalents(folder: Path = EQUIVALENTS) -> dict[str, str]:
    """Every survivor judged equivalent, by mutant key, from all the notebooks' files."""
    return {e["key"]: e["reason"] for path in sorted(folder.glob("*.json"))
            for e in json.loads(path.read_text(encoding="utf-8"))}


def _child(conn, job) -> None:
    _worker_init()
    try:
        conn.send(_evaluate(job))
    finally:
        conn.close()


def run(exercises: list[Exercise], jobs: int, timeout: float, progress: bool = True) -> list[Outcome]:
    """Each mutant in a child forked from this process (torch and the checks imported once, before):
    a mutant that corrupts memory or kills its process (a Triton kernel writing out of bounds does)
    is killed without taking the run down, and one that outlives `timeout` is killed by the parent
    too, whatever it is doing."""
    from tqdm.auto import tqdm

    importlib.import_module("autograder.checks")  # imported before forking: every child shares it
    for e in exercises:  # and warmed: what a check builds lazily on first use is built once, here
        status, detail, _ = _evaluate((e.adapter, reference_path(e).read_text(encoding="utf-8"), timeout))
        if status != "survived":
            raise SystemExit(f"the reference of {e.adapter} fails its own check ({detail}): fix that first")
    work = [(m, src) for e in exercises for m, src in generate(e)]
    equivalents = load_equivalents()
    ctx = multiprocessing.get_context("fork")
    results: dict[int, tuple[str, str, float]] = {}
    running: dict[int, tuple] = {}  # index -> (process, pipe, started)
    pending = list(range(len(work)))
    bar = tqdm(total=len(work), disable=not progress, desc="mutants", unit="mutant")
    while pending or running:
        while pending and len(running) < jobs:
            i = pending.pop(0)
            receive, send = ctx.Pipe(duplex=False)
            mutant, source = work[i]
            proc = ctx.Process(target=_child, args=(send, (mutant.exercise, source, timeout)), daemon=True)
            proc.start()
            send.close()
            running[i] = (proc, receive, time.perf_counter())
        multiprocessing.connection.wait([r for _, r, _ in running.values()], timeout=0.5)
        for i, (proc, receive, started) in list(running.items()):
            elapsed = time.perf_counter() - started
            result = None
            if receive.poll():
                try:
                    result = receive.recv()
                except EOFError:  # it died before answering
                    proc.join()
                    result = ("killed", f"the process died (exit code {proc.exitcode})", elapsed)
            elif elapsed > timeout + 10:  # the child's own alarm could not fire (stuck outside Python)
                proc.kill()
                result = ("killed", f"ran past {timeout:g} s", elapsed)
            elif not proc.is_alive():
                result = ("killed", f"the process died (exit code {proc.exitcode})", elapsed)
            if result is not None:
                proc.join()
                receive.close()
                results[i] = result
                del running[i]
                bar.update(1)
    bar.close()
    outcomes = []
    for i, (mutant, _) in enumerate(work):
        status, detail, seconds = results[i]
        if status == "survived" and mutant.key in equivalents:
            status, detail = "equivalent", equivalents[mutant.key]
        outcomes.append(Outcome(mutant, status, detail, seconds))
    return outcomes


# ------------------------------------------------------------------------------- reporting
def summarize(outcomes: list[Outcome], exercises: list[Exercise]) -> list[dict]:
    rows = []
    for e in exercises:
        mine = [o for o in outcomes if o.mutant.exercise == e.adapter]
        count = {s: sum(o.status == s for o in mine) for s in ("killed", "survived", "equivalent")}
        judged = len(mine) - count["equivalent"]
        rows.append({"exercise": e.adapter, "module": e.module, "generated": len(mine), **count,
                     "kill_rate": (count["killed"] / judged) if judged else 1.0})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| exercise | generated | killed | survived | equivalent | killed of non-equivalent |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['exercise']}` | {r['generated']} | {r['killed']} | {r['survived']} | "
                     f"{r['equivalent']} | {r['kill_rate']:.1%} |")
    total = {k: sum(r[k] for r in rows) for k in ("generated", "killed", "survived", "equivalent")}
    judged = total["generated"] - total["equivalent"]
    lines.append(f"| **all** | {total['generated']} | {total['killed']} | {total['survived']} | "
                 f"{total['equivalent']} | {total['killed'] / judged if judged else 1:.1%} |")
    return "\n".join(lines)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m autograder mutate", description=__doc__)
    parser.add_argument("--exercise", action="append", default=None,
                        help="only this exercise (an adapter name; repeatable; default: every exercise)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds one mutant may take over all seeds before it counts as killed "
                             f"(default: {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--json", default=None, help="write the full report (every mutant) here")
    parser.add_argument("--list", action="store_true", help="only list the mutants that would run")
    return parser


def main(args) -> int:
    if args.exercise:
        unknown = [a for a in args.exercise if a not in BY_ADAPTER]
        if unknown:
            raise SystemExit(f"unknown exercise(s) {unknown}; the exercises are {sorted(BY_ADAPTER)}")
        exercises = [BY_ADAPTER[a] for a in args.exercise]
    else:
        exercises = list(EXERCISES)
    if args.list:
        for e in exercises:
            for m, _ in generate(e):
                print(f"{m.exercise}: {m.operator} line {m.line}: {m.original!r} -> {m.mutated!r}")
        return 0
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    started = time.perf_counter()
    outcomes = run(exercises, args.jobs, args.timeout)
    rows = summarize(outcomes, exercises)
    elapsed = time.perf_counter() - started
    print(markdown(rows))
    print(f"\n{len(outcomes)} mutants in {elapsed:.0f} s with {args.jobs} worker(s)")
    for o in outcomes:
        if o.status == "survived":
            print(f"survived: {o.mutant.exercise} {o.mutant.operator} line {o.mutant.line}: "
                  f"{o.mutant.original!r} -> {o.mutant.mutated!r}  key={o.mutant.key!r}")
    if args.json:
        report = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(elapsed, 1), "jobs": args.jobs,
                  "summary": rows,
                  "mutants": [asdict(o.mutant) | {"key": o.mutant.key, "status": o.status, "detail": o.detail,
                                                  "seconds": round(o.seconds, 3)} for o in outcomes]}
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
