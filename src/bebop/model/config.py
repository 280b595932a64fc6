"""Model configuration: a Hugging Face Qwen3 or Qwen3.5 `config.json`, read and validated once.

Families: `qwen3` (dense, full attention everywhere) and `qwen3_5` / `qwen3_5_text` (the hybrid:
`layer_types` mixes Gated DeltaNet linear attention with gated full attention, partial rotary,
(1 + w) RMSNorms). The published Qwen3.5 checkpoints are multimodal: their config nests the text
model under `text_config` (weights under `model.language_model.*`); bebop reads the text model and
keeps the wrapper's own keys (`outer`) to write them back unchanged.

Only the fields the architecture uses are kept; unknown extra fields are carried. A field we
cannot honour (rope scaling, sliding windows, an unknown layer type) is an error rather than
silently wrong output.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_json

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")  # gated attention, layer_types
ONE_PLUS_W_FAMILIES = ("qwen3_next", *HYBRID_FAMILIES)
MOE_FAMILIES = ("qwen3_5_moe", "qwen3_5_moe_text")  # every MLP a sparse MoE block with a shared expert
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                 "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                 "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
LAYER_TYPES = ("full_attention", "linear_attention")


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
    mtp_intermediate_size: int = 0  # the head's MLP width; 0: the trunk's (every engine's layout). A narrower head
    # (bebop's loss study, a head that cannot represent the target) is bebop's own: engines do not load it
    model_type: str = "qwen3"
    # the Qwen3.5 hybrid (defaults: a dense model; from_dict fills them for the hybrid families)
    layer_types: tuple[str, ...] = ()  # per trunk layer, "full_attention" or "linear_attention"; () = all full
    attn_output_gate: bool = False  # q_proj also yields a per-channel sigmoid gate on the attention output
    partial_rotary_factor: float = 1.0  # share of head_dim that RoPE rotates
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # the Qwen3.5 MoE: every MLP routes each token to num_experts_per_tok of num_experts, plus a shared expert
    num_experts: int = 0  # 0: dense MLPs
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    extra: dict = field(default_factory=dict, compare=False)  # fields we carry but do not use
    outer: dict = field(default_factory=dict, compare=False)  # a multimodal wrapper's own keys (text_config nested)

    def __post_init__(self) -> None:
        self._check_positive("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
        if self.num_attention_heads % self.num_key_value_heads:
            raise BebopError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.mtp_num_hidden_layers < 0:
            raise BebopError(f"config.json: mtp_num_hidden_layers must be >= 0, got {self.mtp_num_hidden_layers}")
        if not isinstance(self.mtp_intermediate_size, int) or self.mtp_intermediate_size < 0:
            raise BebopError(f"config.json: mtp_intermediate_size must be >= 0, got {self.mtp_intermediate_size!r}")
        if self.layer_types:
            self._check_hybrid()
        if self.num_experts:
            self._check_positive(*MOE_FIELDS)
            if self.num_experts_per_tok > self.num_experts:
                raise BebopError(f"config.json: num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                                 f"num_experts ({self.num_experts})")

    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BebopError(f"config.json: {name} must be a positive integer, got {value!r}")

    def _check_hybrid(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise BebopError(f"config.json: layer_types has {len(self.layer_types)} entries for "
                             f"num_hidden_layers={self.num_hidden_layers}")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise BebopError(f"config.json: unknown layer type(s) {', '.join(unknown)} (known: {', '.join(LAYER_TYPES)})")
        if "linear_attention" in self.layer_types:
            self._check_positive(*HYBRID_FIELDS[3:])
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise BebopError(f"config.json: linear_num_value_heads ({self.linear_num_value_heads}) is not a "
                                 f"multiple of linear_num_key_heads ({self.linear_num_key_heads})")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise BebopError(f"config.json: partial_rotary_factor {self.partial_rotary_factor} must be in (0, 1] "
                             f"and give an even rotary dimension (head_dim {self.head_dim})")

    @property
    def rotary_dim(self) -> int:
        """Leading dimensions of each head that RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    @property
    def attention_layers(self) -> list[int]:
        """Trunk layers with full attention (each has a slot in the KV cache, in this order)."""
        return [i for i in range(self.num_hidden_layers) if self.layer_type(i) == "full_attention"]

    @property
    def linear_layers(self) -> list[int]:
        """Trunk layers with Gated DeltaNet linear attention (each has recurrent and conv states)."""
        return [i for i in range(self.num_hidden_layers) if self.layer_type(i) == "linear_attention"]

    @property
    def rms_norm_offset(self) -> float:
        """RMSNorm style of the family: Qwen3 dense scales by w, Qwen3.5 / Qwen3-Next by (1 + w)."""
        return 1.0 if self.model_type in ONE_PLUS_W_FAMILIES else 0.0

    @property
    def declared_dtype(self) -> str | None:
        """The dtype config.json declares for the weights (`dtype`, or the older `torch_dtype`), if any: the
        text model's, else a multimodal wrapper's (transformers writes it at the outer level only)."""
        for where in (self.extra, self.outer):
            value = where.get("dtype", where.get("torch_dtype"))
            if isinstance(value, str):
                return value
        return None

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
        outer: dict = {}
        if isinstance(raw.get("text_config"), dict):  # a multimodal wrapper: the text model is nested
            outer = dict(raw)  # its text_config too: the keys a save writes back
            raw = {**raw["text_config"], "model_type": model_type}
            raw.setdefault("tie_word_embeddings", outer.get("tie_word_embeddings", False))
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
        if model_type in HYBRID_FAMILIES:
            kwargs.update(_hybrid_fields(raw, rope))
            if model_type in MOE_FAMILIES:
                kwargs.update({k: raw[k] for k in MOE_FIELDS if k in raw})
                kwargs.setdefault("num_experts", 256)  # transformers' default
        else:  # a dense config may list its (full attention) layer types; the hybrid's fields do not apply
            kwargs = {k: v for k, v in kwargs.items() if k not in HYBRID_FIELDS[1:] + MOE_FIELDS}
            kwargs["layer_types"] = tuple(kwargs.get("layer_types") or ())
        kwargs["extra"] = {k: v for k, v in raw.items() if k not in cls.__dataclass_fields__
                           and k not in ("rope_parameters", "rope_scaling")}
        kept_rope = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta", "partial_rotary_factor")}
        if kept_rope:  # e.g. Qwen3.5's mrope_section: text positions make it plain RoPE; written back as read
            kwargs["extra"]["_rope"] = kept_rope
        kwargs["outer"] = outer
        return cls(**kwargs)

    def to_dict(self) -> dict:
        out = {**self.extra, **asdict(self)}
        for name in ("extra", "outer"):
            out.pop(name)
        rope_theta = out.pop("rope_theta")
        out["rope_parameters"] = {**self.extra.get("_rope", {}), "rope_type": "default", "rope_theta": rope_theta}
        out.pop("_rope", None)
        out["hidden_act"] = "silu"
        if not self.mtp_num_hidden_layers:
            out.pop("mtp_num_hidden_layers")
        if not self.mtp_intermediate_size:
            out.pop("mtp_intermediate_size")
        if not self.num_experts:
            for name in MOE_FIELDS:
                out.pop(name)
        if self.model_type not in HYBRID_FAMILIES:
            for name in HYBRID_FIELDS:
                out.pop(name)
            out["rope_theta"] = rope_theta  # older readers look here
        else:
            out["layer_types"] = list(self.layer_types)
            out["rope_parameters"]["partial_rotary_factor"] = out.pop("partial_rotary_factor")
            out.pop("attn_output_gate")  # implied by the family
        if self.outer:  # the multimodal wrapper, as it was read, around the text model (every key it had)
            read = self.outer["text_config"]
            text = {k: v for k, v in out.items() if k != "tie_word_embeddings" or k in read}
            text = {**read, **text, "model_type": self.model_type.removesuffix("_text") + "_text"}
            return {**self.outer, "text_config": text, "architectures": self.outer.get("architectures", [
                ARCHITECTURES[self.model_type]])}
        return {**out, "architectures": [ARCHITECTURES.get(self.model_type, "Qwen3ForCausalLM")]}


MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
HYBRID_FIELDS = ("layer_types", "attn_output_gate", "partial_rotary_factor", "linear_conv_kernel_dim",
                 "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")


def _hybrid_fields(raw: dict, rope: dict) -> dict:
    """The Qwen3.5 text config's hybrid fields, with transformers' defaults where absent."""
    layers = raw["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if layer_types is None:  # transformers: every full_attention_interval-th layer is full attention
        interval = int(raw.get("full_attention_interval", 4))
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    out = {"layer_types": tuple(layer_types), "attn_output_gate": True,
           "partial_rotary_factor": float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))}
    return out | {k: raw[k] for k in HYBRID_FIELDS[3:] if k in raw}


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
