"""How much a running notebook has written to the host's disk, for the grader to end it past a cap.

The sandbox's `/work` and `/out` are folders of the job on the host's disk (its `/tmp` is a tmpfs of
capped size). The file-size limit caps each file, not how many there are, so a notebook writing file
after file could fill the host's disk: the other sandboxes' records, the other workers' results and
the batch's summary would then fail to be written (red team round 11). The grader measures the job's
folders while the notebook runs (`DiskWatch.over`, every half second or so) and ends the sandbox once
they hold more than `max_mb` or more than `max_entries` files and folders. A notebook can overshoot by
what it writes between two looks (about a second's worth of writing), not more.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def usage(folders, max_entries: int) -> tuple[int, int]:
    """(bytes on disk, entries) under `folders`, links not followed; the count stops past `max_entries`
    (so a notebook that made millions of files costs one bounded walk)."""
    size = count = 0
    pending = [Path(f) for f in folders]
    while pending and count <= max_entries:
        folder = pending.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    count += 1
                    if count > max_entries:
                        break
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:  # gone meanwhile
                        continue
                    size += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(Path(entry.path))
        except OSError:  # removed, or not readable by the grader: nothing to count there
            continue
    return size, count


class DiskWatch:
    """`over()`: None while the folders hold at most `max_mb` MB and `max_entries` entries, else the
    reason, in words, to end the notebook with."""

    def __init__(self, folders, max_mb: int, max_entries: int):
        self.folders, self.max_mb, self.max_entries = list(folders), max_mb, max_entries

    def over(self) -> str | None:
        size, count = usage(self.folders, self.max_entries)
        if size > self.max_mb << 20:
            return f"the notebook wrote more than {self.max_mb} MB to /work and /out: the sandbox was ended"
        if count > self.max_entries:
            return (f"the notebook made more than {self.max_entries} files and folders in /work and /out: "
                    "the sandbox was ended")
        return None
