"""A notebook cannot fill the host's disk through /work and /out (red team round 11): the grader
measures the job's folders while the sandbox runs and ends it past the caps (autograder/disk_watch.py).
Before, only the size of each file was capped: 1.4 GB went into each of /work and /out, and nothing
stopped more."""
from __future__ import annotations

import sys
import time

import pytest

from autograder import sandbox as sb
from autograder.disk_watch import DiskWatch, usage

WRITE_FILES = """
import os, time
for i in range({files}):
    with open(os.path.join({folder!r}, f"f{{i}}"), "wb") as f:
        f.write(b"x" * {size})
print("wrote all", flush=True)
time.sleep(60)
"""


def test_usage_counts_bytes_and_entries_and_stops_past_the_limit(tmp_path):
    (tmp_path / "a").mkdir()
    for i in range(10):
        (tmp_path / "a" / f"{i}").write_bytes(b"y" * 100_000)
    (tmp_path / "link").symlink_to("/usr")  # counted as an entry, never followed
    size, count = usage([tmp_path], max_entries=1000)
    assert count == 12 and size >= 10 * 100_000
    assert usage([tmp_path], max_entries=5)[1] == 6  # the walk stops one past the limit
    assert DiskWatch([tmp_path], max_mb=1, max_entries=1000).over() is None
    assert "more than 0 MB" in DiskWatch([tmp_path], max_mb=0, max_entries=1000).over()
    assert "more than 5 files" in DiskWatch([tmp_path], max_mb=1, max_entries=5).over()


def _sandboxed(tmp_path, limits, code):
    if sb.available() is not None:
        pytest.skip(f"no sandbox here: {sb.available()}")
    started = time.monotonic()
    result = sb.run_job(tmp_path / "job", [sys.executable, "-c", code], budget_s=120, limits=limits)
    return result, time.monotonic() - started


@pytest.mark.parametrize("folder", ["/work", "/out"])
def test_a_notebook_writing_past_the_disk_cap_is_ended_at_once(tmp_path, folder):
    limits = sb.Limits(disk_mb=16)
    result, took = _sandboxed(tmp_path, limits, WRITE_FILES.format(files=64, size=1 << 20, folder=folder))
    assert result.ended_for and "more than 16 MB" in result.ended_for, (result.ended_for, result.log_tail)
    assert result.rc is None and took < 60, took  # ended, not waited out (it sleeps 60 s after writing)


def test_a_notebook_making_too_many_files_is_ended(tmp_path):
    limits = sb.Limits(disk_entries=500)
    result, took = _sandboxed(tmp_path, limits, WRITE_FILES.format(files=2000, size=0, folder="/work"))
    assert result.ended_for and "more than 500 files" in result.ended_for, (result.ended_for, result.log_tail)
    assert took < 60, took


def test_a_notebook_within_the_caps_runs_to_its_end(tmp_path):
    result, _ = _sandboxed(tmp_path, sb.Limits(), "open('/work/small', 'w').write('ok'); print('done')")
    assert result.rc == 0 and result.ended_for is None, result.log_tail
    assert result.report.decode().strip() == "done"
