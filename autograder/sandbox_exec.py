"""Inside the sandbox: run one prepared notebook cell by cell and write what happened to /out.

`python -m autograder.sandbox_exec JOB.json < NOTEBOOK`: the notebook (hidden tests included) comes
on stdin and never exists as a file in the sandbox, and this process makes itself non-dumpable, so
that the student's code (same uid) can read neither; the kernel gets each cell only when it runs.
Everything this process writes is untrusted by the grader (the student's code runs as the same
user and could rewrite it): it is read back as plain data with size limits, the in-kernel test
results only ever lower a score, and the verdict comes from replaying the record in the grader.
After every cell `executed.ipynb` and `status.json` are rewritten (atomically), so that a
notebook killed at its time budget still reports the cells it ran.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

MAX_OUTPUT_CHARS = 100_000  # per cell, all its outputs together
MAX_OUTPUTS = 50  # per cell
MAX_IMAGE_CHARS = 2_000_000  # base64 of one image


def cap_outputs(cell) -> bool:
    """Trim a cell's outputs to the caps (head and tail of long text kept). True if trimmed."""
    outputs = cell.get("outputs", [])
    trimmed = False
    if len(outputs) > MAX_OUTPUTS:
        outputs[:] = outputs[: MAX_OUTPUTS - 1] + outputs[-1:]
        trimmed = True
    budget = MAX_OUTPUT_CHARS
    for out in outputs:
        if "text" in out:
            text = out["text"] if isinstance(out["text"], str) else "".join(out["text"])
            if len(text) > budget:
                half = max(0, budget // 2)
                text = text[:half] + f"\n[... output cut: {len(text) - budget} characters over the limit ...]\n" + \
                    (text[-half:] if half else "")
                trimmed = True
            out["text"] = text
            budget = max(0, budget - len(text))
        for key in ("data",):
            data = out.get(key)
            if not isinstance(data, dict):
                continue
            for mime in list(data):
                value = data[mime] if isinstance(data[mime], str) else "".join(map(str, data[mime]))
                limit = MAX_IMAGE_CHARS if mime.startswith("image/") else budget
                if len(value) > limit:
                    del data[mime]
                    data.setdefault("text/plain", f"[{mime} output dropped: {len(value)} characters over the limit]")
                    trimmed = True
                elif not mime.startswith("image/"):
                    budget = max(0, budget - len(value))
        if "traceback" in out:
            tb = "\n".join(out["traceback"])[-20_000:]
            out["traceback"] = [tb]
    return trimmed


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): processes of the same uid (the kernel) cannot read this one's
    memory through /proc/<pid>/mem (it holds the hidden tests). Best effort off Linux."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(job_path: str) -> int:
    import nbformat

    from .grade import _Executor

    _not_dumpable()
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    nb = nbformat.reads(sys.stdin.buffer.read().decode("utf-8"), as_version=4)
    sys.stdin.close()
    out_dir = job["out"]
    deadline = time.monotonic() + float(job["budget_s"])

    def save(executor):
        for cell in nb.cells:
            if cell.get("cell_type") == "code":
                cap_outputs(cell)
        _write_atomic(os.path.join(out_dir, "executed.ipynb"), nbformat.writes(nb))
        _write_atomic(os.path.join(out_dir, "status.json"),
                      json.dumps({"status": {str(k): v for k, v in executor.status.items()}, "log": executor.log[:200],
                                  "restarts": executor.restarts, "timings": executor.timings}))

    executor = _Executor(nb, job["cwd"], job["kernel"], int(job["timeout"]), stage=None, deadline=deadline,
                         on_cell=save, env_extra=job.get("env", {}), budget_s=float(job["budget_s"]))
    asyncio.run(executor.run())
    save(executor)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
