"""Put on PYTHONPATH by bebop's vLLM worker only (bebop/vllm/worker.py), for the subprocesses vLLM starts."""

import bebop_torchvision_shim  # noqa: F401
