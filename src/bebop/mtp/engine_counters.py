"""An engine's own speculative-decoding counters beside the acceptance the head allows (`diagnose --engine-metrics`).

    counters = read_counters("vllm_metrics.json")     # vLLM's names (with or without the "vllm:" prefix) or SGLang's
    rows = compare(counters, report)                    # per depth: measured, its Wilson 95% interval, predicted, flag

vLLM: {"spec_decode_num_drafts": N, "spec_decode_num_draft_tokens": N*K, "spec_decode_num_accepted_tokens": A,
"spec_decode_num_accepted_tokens_per_pos": [a_1, ..., a_K]} (the Prometheus counters, or `LLM.get_metrics()`
values copied out). SGLang: {"accept_length": L} (its mean accepted length per step, bonus token included), with
"num_drafts" when known. A depth is flagged when its measured acceptance lies below the predicted value's
lower bound beyond the measurement's own interval: acceptance the head allows that the engine loses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bebop.errors import BebopError
from bebop.stats.entropy_bins import wilson

VLLM_KEYS = ("spec_decode_num_drafts", "spec_decode_num_accepted_tokens_per_pos")


def read_counters(path: str | os.PathLike) -> dict:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BebopError(f"cannot read engine metrics {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise BebopError(f"{path}: engine metrics must be a JSON object of counters")
    return parse_counters(raw, str(path))


def parse_counters(raw: dict, where: str = "engine metrics") -> dict:
    """vLLM's counters ("vllm:" prefix optional) or SGLang's accept_length -> {"engine", "num_drafts", ...}."""
    counters = {key.removeprefix("vllm:").removeprefix("sglang:"): value for key, value in raw.items()}
    if all(key in counters for key in VLLM_KEYS):
        per_pos = counters["spec_decode_num_accepted_tokens_per_pos"]
        if not isinstance(per_pos, list) or not all(isinstance(x, (int, float)) for x in per_pos):
            raise BebopError(f"{where}: spec_decode_num_accepted_tokens_per_pos must be a list of counts")
        return {"engine": "vllm", "num_drafts": float(counters["spec_decode_num_drafts"]),
                "num_draft_tokens": float(counters.get("spec_decode_num_draft_tokens", 0)),
                "accepted_per_pos": [float(x) for x in per_pos]}
    if "accept_length" in counters:
        return {"engine": "sglang", "accept_length": float(counters["accept_length"]),
                "num_drafts": float(counters.get("num_drafts", 0))}
    raise BebopError(f"{where}: no speculative-decoding counters (need vLLM's {' and '.join(VLLM_KEYS)}, "
                     "or SGLang's accept_length)")


def compare(counters: dict, report: dict) -> dict:
    """The counters against the diagnosis: per depth (vLLM) or the mean acceptance length (SGLang)."""
    if counters["engine"] == "sglang":
        k = str(report["k"])
        predicted = report["mean_acceptance_length"]["rs"][k]
        low = report["mean_acceptance_length_intervals"]["rs"][k][0]
        measured = counters["accept_length"]
        return {"engine": "sglang", "k": report["k"], "measured_mean_acceptance_length": measured,
                "predicted_rs": predicted, "below_bound": low is not None and measured < low}
    reached = [counters["num_drafts"]] + counters["accepted_per_pos"][:-1]
    rows = []
    for d, (accepted, n) in enumerate(zip(counters["accepted_per_pos"], reached), start=1):
        pred = report["rs_acceptance_per_depth"][d - 1] if d <= report["k"] else None
        bound = report["rs_acceptance_intervals"][d - 1][0] if d <= report["k"] else None
        low, high = wilson(int(accepted), int(n)) if n else (None, None)
        rate = accepted / n if n else None
        rows.append({"depth": d, "measured": rate, "low": low, "high": high, "predicted_rs": pred,
                     "predicted_to": report["to_acceptance_per_depth"][d - 1] if d <= report["k"] else None,
                     "below_bound": bool(high is not None and bound is not None and high < bound)})
    drafts = counters["num_drafts"]
    length = 1 + sum(counters["accepted_per_pos"]) / drafts if drafts else None
    return {"engine": "vllm", "per_depth": rows, "measured_mean_acceptance_length": length,
            "flagged": any(r["below_bound"] for r in rows)}
