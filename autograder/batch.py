"""Many submissions: parallel over the cores, a progress bar, one JSON per submission, a summary
CSV, resumable.

`python -m autograder grade submitted/ --json grades.json --out results/ --jobs 2`:

- each submission is graded by a worker process (spawned, `PYTHONHASHSEED=0` like the kernels, so
  that the grader's replay iterates sets exactly as the sandbox did), in its own sandbox;
- `results/<student>__<assignment>__<notebook>__<hash>.json` is written (atomically) as soon as
  that submission is graded, so nothing is lost if the run is interrupted or a worker dies (the
  name is an ASCII slug plus a hash of the exact student and notebook: `result_name`);
  `results/summary.csv` (student, notebook, score, max_score, flags, integrity, errors) is
  rewritten as results come in, every cell safe from spreadsheet formulas (`csv_cell`);
- a submission is refused, not run, when it or anything next to it is a symbolic link
  (`symlink_refusal`), when its folder names no assignment (`grade.source_lookup`), or when it is
  another assignment's notebook (`grade.source_mismatch`);
- run the same command again and every submission whose JSON is there, for the same file
  contents (SHA-256) and the same source, is taken from it instead of being graded again.

One submission is one command (`python -m autograder grade ONE.ipynb --json ONE.json`), so a
cluster's batch system can fan a cohort out: one array task per notebook, then
`python -m autograder grade submitted/ --json grades.json --out results/` on the collected
results re-grades nothing and writes the summary (docs/grading.md shows a Slurm example).
"""
from __future__ import annotations

import csv
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import unicodedata
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from .lean_imports import skip_slow_optional_imports
from pathlib import Path

RESULT_VERSION = 2


def find_notebooks(folder: Path) -> list[Path]:
    """The notebooks below `folder` (checkpoints skipped), without following symbolic links: a
    linked notebook or folder is listed as itself, for the batch to refuse by name."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".ipynb_checkpoints")
        found += [Path(dirpath) / d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        found += [Path(dirpath) / f for f in filenames if f.endswith(".ipynb")]
    return sorted(found)


def _below(path: Path, roots: list[Path]) -> tuple[Path, tuple[str, ...]] | None:
    """(root, parts of `path` below it) for the first folder of `roots` above `path`. Symbolic links
    are not resolved (a link must be seen, not followed), so paths are compared as written."""
    absolute = Path(os.path.abspath(path))
    for root in roots:
        top = Path(os.path.abspath(root))
        if top in absolute.parents:
            return Path(root), absolute.relative_to(top).parts
    return None


def student_and_notebook(path: Path, roots: list[Path]) -> tuple[str, str]:
    """('alice', '03_paged_kv/03_paged_kv.ipynb') for submitted/alice/03_paged_kv/03_paged_kv.ipynb
    under the folder given on the command line (nbgrader's layout); the file's stem otherwise."""
    below = _below(path, roots)
    if below is not None and len(below[1]) >= 2:
        return below[1][0], "/".join(below[1][1:])
    parts = Path(os.path.abspath(path)).parts[-3:]  # .../<student>/<assignment>/<notebook>.ipynb
    if len(parts) == 3:
        return parts[0], "/".join(parts[1:])
    return Path(path).stem, Path(path).name


def symlink_refusal(path: Path, roots: list[Path]) -> str | None:
    """Why `path` is refused, or None: it, a folder on its way down from the folder given on the
    command line (for a notebook given by itself: its <student>/<assignment> folders, which a
    shell glob would have gone through), or a file next to it (copied into the sandbox as data)
    is a symbolic link. A link is named, never followed (submitted/eve/00_setup/data.txt ->
    solutions/... would put the answer key where the student's code can print it)."""
    path = Path(path)
    below = _below(path, roots)
    if below is not None:
        chain = [below[0].joinpath(*below[1][:i]) for i in range(1, len(below[1]) + 1)]
    else:
        chain = [p for p in (path.parent.parent, path.parent) if p.name] + [path]
    links = [p for p in chain if os.path.islink(p)]
    if not links and os.path.isdir(path.parent):
        try:
            with os.scandir(path.parent) as entries:
                links = sorted(path.parent / e.name for e in entries if e.is_symlink())
        except OSError:
            links = []  # (an unreadable folder: grading reports it)
    if not links:
        return None
    return (f"{links[0]} is a symbolic link: refused (a submission's files and folders are never followed out "
            "of it: hand in the files themselves)")


def result_name(student: str, notebook: str, suffix: str = ".json") -> str:
    """`<student>__<assignment>__<notebook>__<hash><suffix>`: a readable ASCII slug (any Unicode
    folded to ASCII, anything else `_`, at most 80 characters) and 12 hex digits of the SHA-256 of
    the exact (student, notebook) pair, so that names differing only in letters the slug drops
    ('José' / 'Josè'), in `/` or `__`, or in case, never share a file. One path component, never
    hidden, never `..`."""
    exact = json.dumps([student, notebook])  # (ASCII: undecodable bytes of a file name survive too)
    digest = hashlib.sha256(exact.encode("ascii")).hexdigest()[:12]
    readable = unicodedata.normalize("NFKD", f"{student}__{notebook}".replace("/", "__")).removesuffix(".ipynb")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", readable.encode("ascii", "ignore").decode("ascii"))
    slug = slug[:80].strip("._-") or "submission"
    return f"{slug}__{digest}{suffix}"


def inside(folder: Path, name: str) -> Path:
    """folder/name, after checking that it resolves to a file directly in `folder`."""
    top = Path(folder).resolve()
    target = top / name
    if target.resolve().parent != top or target.name != name:
        raise ValueError(f"refusing to write {name!r}: it is not a file name inside {top}")
    return target


_FORMULA_START = ("=", "+", "-", "@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def csv_cell(value) -> str:
    """A summary.csv cell that no spreadsheet reads as a formula (OWASP's CSV injection advice):
    control characters, line breaks included, written as escapes (`\\n`), and a cell starting
    with =, +, -, @ (after spaces), a tab, CR or LF given a leading apostrophe."""
    text = str(value)
    risky = text[:1] in ("\t", "\r", "\n") or text.lstrip(" ")[:1] in _FORMULA_START
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
    return "'" + text if risky else text


def terminal_safe(text: str) -> str:
    """A line for the instructor's terminal: escape sequences, line breaks and invisible controls
    from students' file names and messages written as escapes."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))


def _sha256(path: Path) -> str:
    from .sandbox_run import _open_no_follow

    h = hashlib.sha256()
    try:
        with _open_no_follow(Path(path)) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except Exception:  # noqa: BLE001 - unreadable, a link, not a file: grading says why
        return ""
    return h.hexdigest()


def _refused(task: dict, why: str) -> dict:
    """The entry of a submission the grader does not run: every test cell of its source (if it has
    one) not run, with the reason."""
    from .notebook_cells import is_test_cell, points
    from .scoring import _cell_entry, _empty_entry
    from .source_notebook import _read

    entry = _empty_entry(task["path"], task["source"])
    entry["errors"].append(why[:1000])
    if task["source_copy"]:
        tests = [c for c in _read(Path(task["source_copy"])).cells if is_test_cell(c)]
        entry["max_score"] = sum(points(c) for c in tests)
        entry["cells"] = [_cell_entry(c, 0.0, "not_run", why[:1000]) for c in tests]
    return entry


def _mismatch(task: dict) -> str | None:
    """Why the submission is another assignment's notebook (grade.source_mismatch), or None. An
    unreadable submission is left to grade_notebook, which says why."""
    from .sandbox_run import read_submission
    from .source_notebook import source_mismatch

    if not task["source_copy"]:
        return None
    try:
        submission = read_submission(Path(task["path"]), task["max_bytes"])
    except Exception:  # noqa: BLE001
        return None
    ids = {key: set(value) for key, value in task["answer_ids"].items()}
    return source_mismatch(submission, ids.get(task["source_key"], set()), task["source_key"], ids)


def grade_task(task: dict) -> dict:
    """One submission (in a worker process): grade it (or refuse it), write its JSON and HTML,
    return the entry."""
    from .feedback_html import render_html
    from .pipeline import grade_notebook
    from .sandbox_run import GradingRefused

    path = Path(task["path"])
    why = task["refused"] or _mismatch(task)
    if why is not None:
        entry, nb = _refused(task, why), None
    else:
        try:
            entry, nb = grade_notebook(path, Path(task["source_copy"]) if task["source_copy"] else None,
                                       timeout=task["timeout"], kernel_name=task["kernel"], guard=task["guard"],
                                       sandbox=task["sandbox"], budget_s=task["budget_s"], max_bytes=task["max_bytes"])
        except GradingRefused as exc:  # (a link that appeared next to it since the batch looked)
            entry, nb = _refused(task, str(exc)), None
        except Exception as exc:  # noqa: BLE001 - a grader bug on one notebook must not lose the others
            from .scoring import _empty_entry

            entry, nb = _empty_entry(path, task["source"]), None
            entry["errors"].append(f"grader error: {type(exc).__name__}: {exc}")
    entry["source"] = task["source"]
    entry.update(student=task["student"], notebook=task["notebook"], submission_sha256=task["sha256"],
                 result_version=RESULT_VERSION)
    if task["html_dir"] is not None:
        page = inside(_made(task["html_dir"]), result_name(task["student"], task["notebook"], ".html"))
        _write_atomic(page, render_html(entry, nb))
        entry["html"] = str(page)
    if task["out_dir"] is not None:
        path = inside(_made(task["out_dir"]), result_name(task["student"], task["notebook"]))
        _write_atomic(path, json.dumps(entry, indent=2) + "\n")
    return entry


def _made(folder) -> Path:
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def _write_atomic(path: Path, text: str) -> None:
    """Write `path` through a temporary file next to it (never through a link planted there)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _previous(out_dir: Path | None, task: dict) -> dict | None:
    if out_dir is None or task["refused"]:
        return None
    try:
        path = inside(out_dir, result_name(task["student"], task["notebook"]))
        entry = None if path.is_symlink() else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (isinstance(entry, dict) and entry.get("submission_sha256") == task["sha256"]
            and entry.get("source") == task["source"] and entry.get("result_version") == RESULT_VERSION):
        return entry
    return None


SUMMARY_COLUMNS = ["student", "notebook", "score", "max_score", "flags", "integrity", "errors", "duration_s"]


def write_summary(path: Path, entries: list[dict]) -> None:
    """summary.csv, one row per submission; every cell through `csv_cell` (students name their
    folders and write the text that ends up in flags and errors)."""
    rows = [SUMMARY_COLUMNS]
    for e in sorted(entries, key=lambda e: (str(e.get("student", "")), str(e.get("notebook", "")))):
        joined = {key: " | ".join(map(str, e.get(key, []))) for key in ("flags", "integrity", "errors")}
        rows.append([e.get("student", ""), e.get("notebook", ""), f"{e['score']:g}", f"{e['max_score']:g}",
                     joined["flags"][:2000], joined["integrity"][:2000], joined["errors"][:500], e.get("duration_s", "")])
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([[csv_cell(cell) for cell in row] for row in rows])
    os.replace(tmp, path)


def run_batch(paths, *, roots, source_dir, timeout, html_dir, kernel_name, jobs, guard, sandbox, budget_s,
              max_bytes, out_dir=None, progress=True) -> dict:
    from .source_notebook import _read, answer_ids, source_index, source_lookup

    source_dir = Path(source_dir)
    out_dir = Path(out_dir) if out_dir is not None else None
    roots = [Path(r) for r in roots]
    index = source_index(source_dir)
    # Sources are copied once, up front, to a folder no sandbox mounts: a submission that rewrites
    # solutions/ (it cannot: it is not in the sandbox) or the copy (likewise) changes no later grade.
    source_copy = Path(tempfile.mkdtemp(prefix="autograde-sources-"))
    cached: dict[Path, Path] = {}
    for i, src in enumerate(sorted(set(index.values()))):
        dest = source_copy / f"{i}" / src.name
        dest.parent.mkdir(parents=True)
        shutil.copy2(src, dest)
        cached[src] = dest
    ids = {}  # what makes each source that assignment (grade.source_mismatch)
    for key, src in index.items():
        try:
            ids[key] = sorted(answer_ids(_read(cached[src])))
        except Exception:  # noqa: BLE001 - an unreadable source: its submissions say so when graded
            ids[key] = []
    keys = {src: key for key, src in index.items()}
    tasks = []
    for p in paths:
        p = Path(p)
        refused = symlink_refusal(p, roots)
        src, why = (None, "") if refused else source_lookup(p, index)
        student, notebook = student_and_notebook(p, roots)
        tasks.append({"path": str(p), "source": str(src) if src else None,
                      "source_copy": str(cached[src]) if src else None, "source_key": keys.get(src),
                      "answer_ids": ids, "refused": refused or why or None, "student": student,
                      "notebook": notebook, "sha256": "" if refused else _sha256(p), "timeout": timeout,
                      "kernel": kernel_name, "guard": guard, "sandbox": sandbox, "budget_s": budget_s,
                      "max_bytes": max_bytes, "html_dir": str(html_dir) if html_dir else None,
                      "out_dir": str(out_dir) if out_dir else None})
    results: dict[int, dict] = {}
    for i, task in enumerate(tasks):
        previous = _previous(out_dir, task)
        if previous is not None:
            results[i] = previous
    todo = [i for i in range(len(tasks)) if i not in results]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), initial=len(results), unit="nb", desc="grading", smoothing=0)
    saved_seed = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"  # the workers' (read when they start)
    try:
        for attempt in range(2):
            if not todo:
                break
            context = multiprocessing.get_context("spawn")
            try:
                with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))), mp_context=context,
                                         initializer=skip_slow_optional_imports) as pool:
                    futures = {pool.submit(grade_task, tasks[i]): i for i in todo}
                    for future in as_completed(futures):
                        i = futures[future]
                        try:
                            results[i] = future.result()
                        except BrokenProcessPool:
                            raise
                        except Exception as exc:  # noqa: BLE001
                            from .scoring import _empty_entry

                            results[i] = _empty_entry(tasks[i]["path"], tasks[i]["source"])
                            results[i]["errors"].append(f"grader error: {type(exc).__name__}: {exc}")
                        if bar is not None:
                            bar.update(1)
                        if out_dir is not None:
                            write_summary(out_dir / "summary.csv", [results[k] for k in sorted(results)])
            except BrokenProcessPool:
                todo = [i for i in todo if i not in results]
                if attempt == 1:
                    for i in todo:
                        from .scoring import _empty_entry

                        results[i] = _empty_entry(tasks[i]["path"], tasks[i]["source"])
                        results[i]["errors"].append("grader error: the worker grading this notebook died")
            else:
                todo = []
    finally:
        if saved_seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved_seed
        if bar is not None:
            bar.close()
        shutil.rmtree(source_copy, ignore_errors=True)
    notebooks = []
    for i, task in enumerate(tasks):
        entry = results[i]
        entry.setdefault("student", task["student"])
        entry.setdefault("notebook", task["notebook"])
        notebooks.append(entry)
    if out_dir is not None:
        write_summary(out_dir / "summary.csv", notebooks)
    return {"score": sum(n["score"] for n in notebooks), "max_score": sum(n["max_score"] for n in notebooks),
            "notebooks": notebooks}
