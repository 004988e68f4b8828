"""Optional imports the grader's processes do without, because they cost seconds and serve nothing here.

`import nbformat` pulls in jsonschema, whose format checkers import `rfc3987_syntax` when it is
installed (JupyterLab's dependencies bring it): that module builds a parser for the IRI grammar
at import time, 1.3 s of CPU on this machine, in every process that reads a notebook: the sandbox
runner (once per graded notebook), each grading worker, the command line. nbformat's schema checks
no IRI, and jsonschema treats the module as optional (it skips the "iri" format when the import
fails), so marking it absent changes no validation the grader does.
"""
from __future__ import annotations

import sys

SKIPPED = ("rfc3987_syntax",)


def skip_slow_optional_imports() -> None:
    """Before nbformat is first imported: make the optional slow modules fail to import (None in
    sys.modules), unless something already imported them."""
    for name in SKIPPED:
        sys.modules.setdefault(name, None)
