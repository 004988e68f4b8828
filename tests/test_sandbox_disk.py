"""A notebook cannot fill the host's disk (red team round 11): `/work` and `/out` are size-capped tmpfs
of the sandbox's own, and of `/out` only the record is the host's, one file under the file size limit.
Before, both were folders of the job on the host's disk, only each file's size capped: 1.4 GB went into
each, and 3 GB within half a second with `fallocate`. The runner starts in `/job`, never in the
student's folder (`-m` puts the folder it starts in first on `sys.path`)."""
from __future__ import annotations

import sys

import pytest

from autograder import sandbox as sb
from autograder.sandbox_run import runner_command

WRITE = """
import errno, os
def attempt(what, fn):
    try:
        fn()
        print(what, "ok")
    except OSError as exc:
        print(what, errno.errorcode.get(exc.errno, exc.errno))
def files(folder, n, size):
    for i in range(n):
        with open(os.path.join(folder, f"f{i}"), "wb") as f:
            f.write(b"x" * size)
def allocate(path, size):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
attempt("work files", lambda: files("/work", 64, 1 << 20))
attempt("work fallocate", lambda: allocate("/work/big", 6 << 20))  # under file_mb: the tmpfs is full
attempt("out files", lambda: files("/out", 64, 1 << 20))
attempt("record", lambda: allocate("/out/record.jsonl", 64 << 20))
"""


def _job_bytes(job) -> int:
    return sum(p.stat().st_size for p in job.rglob("*") if p.is_file() and p.name != "sandbox.log")


def test_work_and_out_are_capped_and_only_the_record_reaches_the_host(tmp_path):
    if sb.available() is not None:
        pytest.skip(f"no sandbox here: {sb.available()}")
    limits = sb.Limits(work_mb=16, out_mb=4, file_mb=8)
    result = sb.run_job(tmp_path / "job", [sys.executable, "-c", WRITE], budget_s=120, limits=limits)
    said = dict(line.rsplit(" ", 1) for line in result.report.decode().splitlines())
    assert said == {"work files": "ENOSPC", "work fallocate": "ENOSPC", "out files": "ENOSPC", "record": "EFBIG"}, (
        said, result.log_tail)
    assert sorted(p.name for p in (tmp_path / "job" / "out").iterdir()) == [sb.RECORD]
    assert _job_bytes(tmp_path / "job") < 9 << 20  # the record (under file_mb) and nothing else


def test_the_runner_starts_outside_the_students_folder(tmp_path):
    args = sb.bwrap_args(tmp_path, None, sb.Limits())
    assert args[args.index("--chdir") + 1] == "/job"
    command = runner_command("/job/job.json")
    assert command[-2:] == ["autograder.sandbox_exec", "/job/job.json"]
    assert ("-P" in command) == (sys.version_info >= (3, 11))
