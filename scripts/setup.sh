#!/usr/bin/env bash
# Set up everything the course needs in the current Python (3.10+): a CPU build of PyTorch
# first (a bare `torch` requirement would pull a multi-GB CUDA build), then this project with
# its test, notebook and Hugging Face extras. Safe to run again.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
# System packages (Debian): chromium for the real-browser JupyterLab test, bubblewrap for the
# grader's sandbox. Installed only when missing, and only where we may (root with apt-get, as in
# CI); elsewhere a note says what the tests that need them will do without.
if ! command -v chromium >/dev/null 2>&1 || ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium bubblewrap >/dev/null
  else
    echo "note: chromium and/or bubblewrap missing (install them with your package manager):" \
         "the browser test is skipped without chromium, the sandboxed grading needs bubblewrap" >&2
  fi
fi
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet -e ".[dev]"
# GuideLLM, a benchmark client nobody here wrote, for the test that points it at `serve`: in a virtual
# environment of its own (.bench-venv) that sees this Python's packages, so it reuses the CPU torch
# instead of pulling a CUDA build. COURSE_SKIP_BENCH_VENV=1 leaves it out (that test then skips,
# except under CI, where it fails).
if [ "${COURSE_SKIP_BENCH_VENV:-0}" != 1 ] && ! .bench-venv/bin/python -c "import guidellm" 2>/dev/null; then
  "$PYTHON" -m venv --system-site-packages .bench-venv
  .bench-venv/bin/python -m pip install --quiet "guidellm==0.8.1"
fi
"$PYTHON" -m course_lib --help >/dev/null
echo "setup done: $("$PYTHON" -c 'import torch, course_lib; print("torch", torch.__version__, "| course_lib", course_lib.__version__)')"
