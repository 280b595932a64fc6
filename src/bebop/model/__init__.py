"""The Qwen3 trunk, its KV cache and checkpoint I/O."""

from bebop.model.checkpoint import load_model, save_model
from bebop.model.config import ModelConfig, read_config, write_config
from bebop.model.kv_cache import KVCache
from bebop.model.qwen3 import CausalLM

__all__ = ["CausalLM", "KVCache", "ModelConfig", "load_model", "read_config", "save_model", "write_config"]
