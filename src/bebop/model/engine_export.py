"""`bebop mtp export`: a model directory with its trained head, laid out for vLLM's or SGLang's MTP loader.

    settings = export_head(model_dir, engine="vllm", out=out_dir, k=3)   # -> the launch settings, as text

Both engines load an MTP head only for the Qwen3-Next / Qwen3.5 families, whose checkpoints carry it as
`mtp.*` tensors beside the trunk (the layout `bebop mtp train` saves): the export is a copy of the directory.
For vLLM the copy's rope parameters lose `mrope_section` (text positions make it plain RoPE; with it vLLM's
CPU drafter aborts: docs/vllm.md), so the copy serves text only. A dense Qwen3's head, which neither
engine loads as MTP, is refused with one line. The user's directory is only read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_json
from bebop.model.config import HYBRID_FAMILIES, ModelConfig, read_config

EXPORT_ENGINES = ("vllm", "sglang")  # serving engines whose MTP loader an export targets


def export_head(model_dir: str | Path, *, engine: str, out: str | Path, k: int = 3) -> str:
    src, dst = Path(model_dir), Path(out)
    if engine not in EXPORT_ENGINES:
        raise BebopError(f"--engine must be one of {', '.join(EXPORT_ENGINES)}, got {engine!r}")
    check_engine_head(read_config(src), src, engine)
    if dst.exists():
        raise BebopError(f"--out {dst} already exists")
    staged = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(src, staged)
    if engine == "vllm":
        drop_mrope(staged / "config.json")
    staged.rename(dst)  # the export appears whole or not at all
    return launch_settings(engine, dst, k)


def check_engine_head(cfg: ModelConfig, src: str | Path, engine: str) -> None:
    """The model of config `cfg` (from `src`, which the messages name) has a head that `engine` loads as MTP, else
    one line saying why not."""
    if not cfg.mtp_num_hidden_layers:
        raise BebopError(f"{src} has no MTP head (config.json: mtp_num_hidden_layers is 0); add one with "
                         "`bebop mtp init` and train it with `bebop mtp train`")
    if cfg.mtp_intermediate_size and cfg.mtp_intermediate_size != cfg.intermediate_size:
        raise BebopError(f"{src}'s head has intermediate size {cfg.mtp_intermediate_size}, not the trunk's "
                         f"{cfg.intermediate_size}: {engine} builds the head in the trunk's layout (a study head; "
                         "serve it with bebop's engine)")
    if cfg.model_type not in HYBRID_FAMILIES:
        raise BebopError(f"{engine} loads MTP heads only for Qwen3-Next / Qwen3.5 checkpoints, not a dense "
                         f"{cfg.model_type!r} model: serve this head with bebop's engine (`--spec rs`)")


def drop_mrope(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    for section in (raw, raw.get("text_config") or {}):
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(section.get(key), dict):
                section[key].pop("mrope_section", None)
    atomic_write_json(path, raw)


def launch_settings(engine: str, model: Path, k: int) -> str:
    if engine == "vllm":
        spec = {"method": "mtp", "num_speculative_tokens": k, "draft_sample_method": "probabilistic"}
        return (f"LLM(model={str(model)!r}, speculative_config={json.dumps(spec)})\n"
                f"vllm serve {model} --speculative-config '{json.dumps(spec)}'\n"
                "warning: without draft_sample_method=\"probabilistic\" vLLM drafts greedily, which is target-only "
                "verification (TO): a head trained for rejection sampling (e2e_tv) loses its advantage there")
    return (f"python -m sglang.launch_server --model-path {model} --speculative-algorithm NEXTN "
            f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}\n"
            "warning: SGLang verifies by target-only sampling (sgl-kernel's tree_speculative_sampling_target_only): "
            "a head trained for rejection sampling (e2e_tv) loses its advantage there")
