#!/usr/bin/env bash
# The GPU check of issue 17 as one prepared script, for the lent H200 (the device tool's `run`,
# which sets $OUT) or any CUDA machine:
#
#     bash benchmarks/gpu_check.sh            # writes $OUT (default benchmarks/results/gpu/)
#
# 1. `pytest -m cuda` (tests/test_cuda.py), its measured rates in cuda_tests.jsonl;
# 2. benchmarks/gpu_costs.py at the Qwen3-1.7B and Qwen3-8B shapes, bfloat16, batch 1-256, with
#    torch.compile'd decode timed beside eager (gpu_costs.jsonl);
# 3. where a policy with a trained MTP head is at $BEBOP_GPU_MODEL (default .gpu-model/, carried: config,
#    weights, tokenizer): benchmarks/spec_vs_plain.py on CUDA in bfloat16, eager and compiled, plain against
#    RS K=3 and --k auto, batch 1 and 64 rows (spec_vs_plain.log); else it says it was skipped;
# 4. where the machine has vLLM (a GPU wheel, in $BEBOP_VLLM_PYTHON or this python3; the device cannot install
#    one): the weight sync through vLLM's update sessions (benchmarks/vllm_sync.py, dense and a Qwen3.5 drafting
#    with its head, CUDA graphs on) and a `bebop generate --engine vllm` (vllm_sync.jsonl, vllm.log);
#    else vllm.log says it was skipped.
# It runs under the machine's own python3 and torch (the device image holds torch, transformers,
# safetensors, matplotlib and pytest); bebop is taken from src/ on PYTHONPATH, nothing installed.
# Each part has its own time limit so that one hang cannot eat the lease: under 10 minutes in all, 14 with vLLM.
set -o pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$OUT/machine.txt"
BEBOP_CUDA_REPORT="$OUT/cuda_tests.jsonl" timeout 150 python3 -m pytest -p no:cacheprovider -m cuda tests/test_cuda.py \
    -q -s 2>&1 | tee "$OUT/cuda_tests.log"
(cd benchmarks && timeout 230 python3 gpu_costs.py --device cuda --compile --batches 1,16,64,256 \
    --out "$OUT/gpu_costs.jsonl") 2>&1 | tee "$OUT/gpu_costs.log"
MODEL=$(realpath "${BEBOP_GPU_MODEL:-.gpu-model}" 2>/dev/null)
if [ -f "$MODEL/config.json" ]; then
    (cd benchmarks && timeout 90 python3 spec_vs_plain.py --device cuda --model "$MODEL" --runs 1 \
        --cases 1:longtail,64:longtail --arms plain,rs:3,rs:auto
     timeout 100 python3 spec_vs_plain.py --device cuda --model "$MODEL" --runs 1 \
        --cases 1:longtail,64:longtail --arms plain+compile,rs:3+compile) 2>&1 | tee "$OUT/spec_vs_plain.log"
else
    echo "skipped: no policy at ${BEBOP_GPU_MODEL:-.gpu-model} (a model dir with a trained MTP head)" \
        | tee "$OUT/spec_vs_plain.log"
fi
VLLM_PY=${BEBOP_VLLM_PYTHON:-python3}
if "$VLLM_PY" -c "import vllm" >/dev/null 2>&1; then
    export BEBOP_VLLM_PYTHON="$(command -v "$VLLM_PY")"
    (cd benchmarks && timeout 150 python3 vllm_sync.py --vllm-python "$BEBOP_VLLM_PYTHON" --sizes default,1024x16 \
        --steps 4 && timeout 150 python3 vllm_sync.py --vllm-python "$BEBOP_VLLM_PYTHON" --arch qwen35 --spec rs \
        --dtype bfloat16 --sizes 1024x16 --steps 4) 2>&1 | tee "$OUT/vllm.log" | grep '^{' > "$OUT/vllm_sync.jsonl"
    timeout 60 python3 -m bebop init --out "$OUT/tmp-model" >> "$OUT/vllm.log" 2>&1
    timeout 120 python3 -m bebop generate --model "$OUT/tmp-model" --prompt "12+7=" --max-new-tokens 64 \
        --engine vllm --temperature 1.0 >> "$OUT/vllm.log" 2>&1
    echo "vllm generate exit $?" | tee -a "$OUT/vllm.log"
    rm -rf "$OUT/tmp-model"
else
    echo "skipped: no vLLM in $VLLM_PY (set BEBOP_VLLM_PYTHON to a Python with a GPU vLLM wheel)" | tee "$OUT/vllm.log"
fi
