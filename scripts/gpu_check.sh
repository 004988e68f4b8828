#!/usr/bin/env bash
# Everything that needs a GPU, in one call (a GPU session's device time is short):
#   1. the Triton kernel tests on CUDA (bf16 included) and the engine on the Triton backend;
#   2. `bench attention`, the full GPU sweep, as JSON and as the table for docs/benchmarks.md;
#   3. `bench engine --profile` on the GPU: where a step's time goes when the forward is fast.
# Uses the machine's own torch and triton (nothing is installed); results go to $OUT (default
# ./gpu_results). About 3-5 minutes on an H100/H200, most of it Triton compiling kernels.
# Afterwards: copy attention_gpu.json to docs/ (notebook 4 shows a stored GPU result found there)
# and its table into docs/benchmarks.md, with the device name and date.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())" \
  2>&1 | tee "$OUT/env.txt" || exit 1
timeout 300 python3 -m pytest tests/test_triton_attention.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/tests.txt" || status=1
timeout 300 python3 -m course_lib bench attention --json "$OUT/attention_gpu.json" 2>&1 | tee "$OUT/bench_attention.txt" || status=1
# (Phases are host-side times: the GPU runs ahead until the sampler reads the tokens back, so
# the total per step is the number to trust.)
timeout 120 python3 -c "
import sys, torch
from course_lib.bench.engine import format_profile, profile_engine_step
from course_lib import EngineConfig, load_tiny
device = sys.argv[1]
model, _ = load_tiny(torch.float32, device)
for running in (1, 64, 256):
    print(format_profile(profile_engine_step(model, running=running, steps=40, config=EngineConfig(max_num_seqs=256))))
" "${GPU_CHECK_DEVICE:-cuda}" 2>&1 | tee "$OUT/engine_profile.txt" || status=1
exit $status
