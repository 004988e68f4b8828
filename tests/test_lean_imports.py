"""The grader's processes skip jsonschema's optional IRI parser (autograder.lean_imports): 1.3 s of
every sandbox runner's start on this machine, for a format nbformat's schema never checks."""
from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, time
from autograder.lean_imports import SKIPPED, skip_slow_optional_imports
skip_slow_optional_imports()
import nbformat
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
nbformat.validate(nb)
nbformat.reads(nbformat.writes(nb), as_version=4)
print([name for name in SKIPPED if sys.modules.get(name) is not None])
"""


def test_nbformat_reads_and_validates_without_the_skipped_modules():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported anyway: {out.stdout}"


def test_a_module_already_imported_is_left_alone():
    from autograder.lean_imports import skip_slow_optional_imports

    sys.modules["rfc3987_syntax_probe"] = module = type(sys)("rfc3987_syntax_probe")
    try:
        import autograder.lean_imports as lean

        saved = lean.SKIPPED
        lean.SKIPPED = ("rfc3987_syntax_probe",)
        skip_slow_optional_imports()
        assert sys.modules["rfc3987_syntax_probe"] is module
    finally:
        lean.SKIPPED = saved
        sys.modules.pop("rfc3987_syntax_probe", None)
