"""Many submissions: parallel over the cores, a progress bar, one JSON per submission, a summary
CSV, resumable.

`python -m autograder grade submitted/ --json grades.json --out results/ --jobs 2`:

- each submission is graded by a worker process (spawned, `PYTHONHASHSEED=0` like the kernels, so
  that the grader's replay iterates sets exactly as the sandbox did), in its own sandbox;
- `results/<student>__<assignment>__<notebook>.json` is written (atomically) as soon as that
  submission is graded, so nothing is lost if the run is interrupted or a worker dies;
  `results/summary.csv` (student, notebook, score, max_score, flags, integrity, errors) is
  rewritten as results come in;
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
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

RESULT_VERSION = 2


def student_and_notebook(path: Path, roots: list[Path]) -> tuple[str, str]:
    """('alice', '03_paged_kv/03_paged_kv.ipynb') for submitted/alice/03_paged_kv/03_paged_kv.ipynb
    under the folder given on the command line (nbgrader's layout); the file's stem otherwise."""
    path = path.resolve()
    for root in roots:
        root = root.resolve()
        if root.is_dir() and root in path.parents:
            parts = path.relative_to(root).parts
            if len(parts) >= 2:
                return parts[0], "/".join(parts[1:])
    parts = path.parts[-3:]  # .../<student>/<assignment>/<notebook>.ipynb
    if len(parts) == 3:
        return parts[0], "/".join(parts[1:])
    return path.stem, path.name


def result_name(student: str, notebook: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{student}__{notebook}".replace("/", "__")).removesuffix(".ipynb") + ".json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return ""
    return h.hexdigest()


def grade_task(task: dict) -> dict:
    """One submission (in a worker process): grade it, write its JSON and HTML, return the entry."""
    from .grade import grade_notebook, render_html

    path = Path(task["path"])
    try:
        entry, nb = grade_notebook(path, Path(task["source_copy"]) if task["source_copy"] else None,
                                   timeout=task["timeout"], kernel_name=task["kernel"], guard=task["guard"],
                                   sandbox=task["sandbox"], budget_s=task["budget_s"], max_bytes=task["max_bytes"])
    except Exception as exc:  # noqa: BLE001 - a grader bug on one notebook must not lose the others
        from .grade import _empty_entry

        entry, nb = _empty_entry(path, task["source"]), None
        entry["errors"].append(f"grader error: {type(exc).__name__}: {exc}")
    entry["source"] = task["source"]
    entry.update(student=task["student"], notebook=task["notebook"], submission_sha256=task["sha256"],
                 result_version=RESULT_VERSION)
    if task["html_dir"] is not None:
        out = Path(task["html_dir"])
        out.mkdir(parents=True, exist_ok=True)
        page = out / result_name(task["student"], task["notebook"]).replace(".json", ".html")
        page.write_text(render_html(entry, nb), encoding="utf-8")
        entry["html"] = str(page)
    if task["out_dir"] is not None:
        _write_json(Path(task["out_dir"]) / result_name(task["student"], task["notebook"]), entry)
    return entry


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _previous(out_dir: Path | None, task: dict) -> dict | None:
    if out_dir is None:
        return None
    path = out_dir / result_name(task["student"], task["notebook"])
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (isinstance(entry, dict) and entry.get("submission_sha256") == task["sha256"]
            and entry.get("source") == task["source"] and entry.get("result_version") == RESULT_VERSION):
        return entry
    return None


def write_summary(path: Path, entries: list[dict]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "score", "max_score", "flags", "integrity", "errors", "duration_s"])
        for e in sorted(entries, key=lambda e: (e.get("student", ""), e.get("notebook", ""))):
            w.writerow([e.get("student", ""), e.get("notebook", ""), f"{e['score']:g}", f"{e['max_score']:g}",
                        " | ".join(e.get("flags", []))[:2000], " | ".join(e.get("integrity", []))[:2000],
                        " | ".join(e.get("errors", []))[:500], e.get("duration_s", "")])
    os.replace(tmp, path)


def run_batch(paths, *, roots, source_dir, timeout, html_dir, kernel_name, jobs, guard, sandbox, budget_s,
              max_bytes, out_dir=None, progress=True) -> dict:
    from .grade import find_source, source_index

    source_dir = Path(source_dir)
    out_dir = Path(out_dir) if out_dir is not None else None
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
    tasks = []
    for p in paths:
        p = Path(p)
        src = find_source(p, index)
        student, notebook = student_and_notebook(p, [Path(r) for r in roots])
        tasks.append({"path": str(p), "source": str(src) if src else None,
                      "source_copy": str(cached[src]) if src else None, "student": student, "notebook": notebook,
                      "sha256": _sha256(p), "timeout": timeout, "kernel": kernel_name, "guard": guard,
                      "sandbox": sandbox, "budget_s": budget_s, "max_bytes": max_bytes,
                      "html_dir": str(html_dir) if html_dir else None, "out_dir": str(out_dir) if out_dir else None})
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
                with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))), mp_context=context) as pool:
                    futures = {pool.submit(grade_task, tasks[i]): i for i in todo}
                    for future in as_completed(futures):
                        i = futures[future]
                        try:
                            results[i] = future.result()
                        except BrokenProcessPool:
                            raise
                        except Exception as exc:  # noqa: BLE001
                            from .grade import _empty_entry

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
                        from .grade import _empty_entry

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
