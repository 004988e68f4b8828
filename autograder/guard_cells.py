"""The in-kernel guard's cells: the setup cell put first and every test cell wrapped (a guard call
at its top, a completion marker at its bottom), and the notebook given back its own sources after."""
from __future__ import annotations

import secrets

import nbformat

from .notebook_cells import grade_id, is_test_cell


def inject_guard(nb, guard_name: str, record_path: str | None = None) -> dict[str, str]:
    """Insert the setup cell and wrap every test cell. Returns grade_id -> completion token.
    With `record_path`, the setup cell also starts the recording session (autograder.record)."""
    record = ""
    if record_path is not None:
        record = (f"import autograder.record as _autograder_record\n_autograder_record.start({record_path!r})\n"
                  "del _autograder_record\n")
    setup = nbformat.v4.new_code_cell(
        "# [autograder] grading setup: runs before any submission code\n"
        f"{record}import autograder.integrity as _autograder_integrity\n"
        f"_autograder_integrity.install({guard_name!r})\n"
        "del _autograder_integrity")
    setup.metadata["autograder"] = {"setup": True, "origin": "grader"}
    tokens = {}
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        gid = grade_id(cell)
        token = secrets.token_hex(12)
        tokens[gid] = token
        original = cell.source
        cell.metadata.setdefault("autograder", {})["original_source"] = original
        cell.source = (f"{guard_name}({gid!r})  # [autograder] integrity guard\n{original}\n"
                       f"{guard_name}.done({gid!r}, {token!r})  # [autograder] completion marker")
    nb.cells.insert(0, setup)
    return tokens


def _strip_guard(nb, tokens: dict[str, str]) -> None:
    """Give cells back their own source and remove the markers from their outputs."""
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("autograder", {})
        if "original_source" in meta:
            cell.source = meta.pop("original_source")
        gid = grade_id(cell)
        if gid in tokens:
            marker = f"[autograder] {gid} ok {tokens[gid]}\n"
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream" and marker in out.get("text", ""):
                    out["text"] = out["text"].replace(marker, "")
            cell["outputs"] = [o for o in cell.get("outputs", [])
                               if not (o.get("output_type") == "stream" and not o.get("text"))]
