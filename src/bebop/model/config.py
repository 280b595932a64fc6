"""Model configuration: the Hugging Face Qwen3 `config.json`, read and validated once.

Only the fields the architecture uses are kept. Unknown extra fields are ignored; a field we
cannot honour (rope scaling, sliding windows) is an error rather than silently wrong output.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_json

SUPPORTED_MODEL_TYPES = ("qwen3",)
ONE_PLUS_W_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    mtp_num_hidden_layers: int = 0  # 0: no MTP head in this checkpoint
    model_type: str = "qwen3"
    extra: dict = field(default_factory=dict, compare=False)  # fields we carry but do not use

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BebopError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise BebopError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.mtp_num_hidden_layers < 0:
            raise BebopError(f"config.json: mtp_num_hidden_layers must be >= 0, got {self.mtp_num_hidden_layers}")

    @property
    def rms_norm_offset(self) -> float:
        """RMSNorm style of the family: Qwen3 dense scales by w, Qwen3.5 / Qwen3-Next by (1 + w)."""
        return 1.0 if self.model_type in ONE_PLUS_W_FAMILIES else 0.0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, list) else (eos,)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "qwen3")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise BebopError(f"config.json: model_type {model_type!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)})")
        rope = raw.get("rope_parameters") or {}
        scaling = raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type != "default":
            raise BebopError(f"config.json: rope type {rope_type!r} is not supported (only 'default')")
        if raw.get("use_sliding_window"):
            raise BebopError("config.json: use_sliding_window=true is not supported")
        known = {f for f in cls.__dataclass_fields__ if f not in ("extra", "rope_theta", "head_dim")}
        kwargs = {k: raw[k] for k in known if k in raw}
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise BebopError(f"config.json: missing required field(s): {', '.join(missing)}")
        kwargs.setdefault("num_key_value_heads", raw["num_attention_heads"])
        kwargs["head_dim"] = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        kwargs["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        kwargs["extra"] = {k: v for k, v in raw.items() if k not in cls.__dataclass_fields__
                           and k not in ("rope_parameters", "rope_scaling")}
        return cls(**kwargs)

    def to_dict(self) -> dict:
        out = {**self.extra, **asdict(self)}
        out.pop("extra")
        rope_theta = out.pop("rope_theta")
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
        out["rope_theta"] = rope_theta  # older readers look here
        out["architectures"] = ["Qwen3ForCausalLM"]
        out["hidden_act"] = "silu"
        if not self.mtp_num_hidden_layers:
            out.pop("mtp_num_hidden_layers")
        return out


def read_config(model_dir: str | os.PathLike) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise BebopError(f"model directory not found: {model_dir}")
    if not path.is_file():
        raise BebopError(f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BebopError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BebopError(f"{path} must hold a JSON object")
    return ModelConfig.from_dict(raw)


def write_config(config: ModelConfig, model_dir: str | os.PathLike) -> None:
    atomic_write_json(Path(model_dir) / "config.json", config.to_dict())
