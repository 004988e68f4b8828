#!/usr/bin/env bash
# Set up everything the course needs in the current Python (3.10+): a CPU build of PyTorch
# first (a bare `torch` requirement would pull a multi-GB CUDA build), then this project with
# its test, notebook and Hugging Face extras. Safe to run again.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet -e ".[dev]"
"$PYTHON" -m course_lib --help >/dev/null
echo "setup done: $("$PYTHON" -c 'import torch, course_lib; print("torch", torch.__version__, "| course_lib", course_lib.__version__)')"
