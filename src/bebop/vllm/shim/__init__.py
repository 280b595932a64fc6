"""Standalone modules for the vLLM side of the boundary, imported by path (worker.py puts this folder on sys.path
and PYTHONPATH), never as bebop.vllm.shim.*: they import only torch and vLLM."""
