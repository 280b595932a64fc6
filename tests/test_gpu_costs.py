"""benchmarks/gpu_costs.py: its --device cpu --tiny run (the code path the GPU run takes) and its
predictions, which are the engine's adaptive rule on measured costs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bebop.engine.adaptive import DRAFT_MARGIN

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import gpu_costs  # noqa: E402


def test_predictions_by_hand():
    # decode 1.0 s, verify(K+1) 1.2 / 1.4 / 1.6 s, an MTP step 0.05 s
    timing = {"decode_s": 1.0, "verify_s": [1.2, 1.4, 1.6], "mtp_s": 0.05}
    low, half, high = gpu_costs.predictions(8, timing, 3, [0.05, 0.5, 0.9])
    # alpha 0.5: K=1: E = 1.5 tokens for 1.2 + 0.05 s -> 1.2; K=2: 1.75 / 1.5 = 1.167; K=3: 1.875 / 1.75 = 1.071
    assert half["speedup_per_k"] == [1.2, 1.167, 1.071] and half["chosen_k"] == 1 and half["chosen_speedup"] == 1.2
    # alpha 0.05: at best 1.05 / 1.25 < 1: speculation would lose, so the rule plays plain steps
    assert max(low["speedup_per_k"]) < 1 and low["chosen_k"] == 0 and low["chosen_speedup"] == 1.0
    # alpha 0.9: 1.9 / 1.25 = 1.52, 2.71 / 1.5 = 1.807, 3.439 / 1.75 = 1.965
    assert high["speedup_per_k"] == [1.52, 1.807, 1.965] and high["chosen_k"] == 3


def test_tiny_cpu_run_writes_consistent_lines(tmp_path):
    out = tmp_path / "gpu_costs.jsonl"
    done = subprocess.run([sys.executable, "gpu_costs.py", "--device", "cpu", "--tiny", "--max-k", "4",
                           "--acceptance", "0.05,0.9", "--out", str(out)], cwd=BENCH, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["shape"], x["batch"]) for x in lines] == [(s, b) for s in ("tiny", "tiny-hybrid") for b in (1, 4, 16)]
    assert done.stdout.splitlines() == [json.dumps(x) for x in lines]
    for x in lines:
        assert x["device"] == "cpu" and x["dtype"] == "float32" and len(x["verify_s"]) == 4
        assert x["verify_over_decode"] == pytest.approx([v / x["decode_s"] for v in x["verify_s"]], abs=2e-3)
        for rule in x["rule"]:
            # the line rounds speedups to 3 places, so a best within that rounding of the margin may go either way
            best, chosen, near = max(rule["speedup_per_k"]), rule["chosen_k"], 5e-4
            if chosen:
                assert best > DRAFT_MARGIN - near and rule["speedup_per_k"][chosen - 1] == best, rule
            else:
                assert best < DRAFT_MARGIN + near, rule


def test_unknown_shape_is_named():
    with pytest.raises(SystemExit, match="unknown shape 'qwen9'"):
        gpu_costs.main(["--device", "cpu", "--shapes", "qwen9", "--batches", "1"])
