#!/usr/bin/env bash
# The GPU check of issue 17 as one prepared script, for the lent H200 (the device tool's `run`,
# which sets $OUT) or any CUDA machine:
#
#     bash benchmarks/gpu_check.sh            # writes $OUT (default benchmarks/results/gpu/)
#
# 1. `pytest -m cuda` (tests/test_cuda.py), its measured rates in cuda_tests.jsonl;
# 2. benchmarks/gpu_costs.py at the Qwen3-1.7B and Qwen3-8B shapes, bfloat16, batch 1-256, with
#    torch.compile'd decode timed beside eager (gpu_costs.jsonl).
# It runs under the machine's own python3 and torch (the device image holds torch, transformers,
# safetensors, matplotlib and pytest); bebop is taken from src/ on PYTHONPATH, nothing installed.
# Each part has its own time limit so that one hang cannot eat the lease: about 9 minutes in all.
set -o pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$OUT/machine.txt"
BEBOP_CUDA_REPORT="$OUT/cuda_tests.jsonl" timeout 180 python3 -m pytest -p no:cacheprovider -m cuda tests/test_cuda.py \
    -q -s 2>&1 | tee "$OUT/cuda_tests.log"
(cd benchmarks && timeout 360 python3 gpu_costs.py --device cuda --compile --out "$OUT/gpu_costs.jsonl") 2>&1 \
    | tee "$OUT/gpu_costs.log"
