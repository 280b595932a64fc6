"""The vLLM side of bebop's process boundary: run by any Python that has vLLM (`--vllm-python`), it imports
nothing of bebop, holds one `vllm.LLM` and answers JSON lines on a channel of its own.

    python worker.py '{"model": DIR, "dtype": "float32", "seed": 0, "max_model_len": null, "enforce_eager": null,
                       "gpu_memory_utilization": 0.9, "sleep_mode": false, "speculative_config": null,
                       "requests_fd": R, "replies_fd": W, "parent": PID, "cleanup": [DIR, ...]}'

The channel: two pipes the client passes (`requests_fd` to read, `replies_fd` to write), not stdin / stdout, so
nothing vLLM or native code prints (file descriptors 1 and 2 both go to the client's log) can corrupt it.
Requests (one JSON object a line, each with an "id") and their answers (with the same "id"):
    {"op": "generate", "prompts": [[ids]], "params": [{...}, ...]}  -> {"outputs": [{"token_ids", "logprobs",
        "finish_reason"}]}; params per prompt: temperature, top_k, top_p, max_tokens, stop_token_ids, seed
    {"op": "update", "path": FILE, "target": [entry], "draft": [entry]}  -> {"seconds": s}: the tensors named
        loaded from the shared-memory file bebop writes (bebop/vllm/shared_weights.py), the target's and then the
        drafter's, each in a weight-update session of vLLM's (shim/bebop_weight_transfer.py); an entry is
        [name, dtype, shape, byte offset]
    {"op": "suspend"} / {"op": "resume"} -> {}: vLLM's sleep mode (a GPU, started with "sleep_mode": true)
    {"op": "metrics"}                    -> {"counters": {name: value or [values]}} (cumulative, vLLM's names)
    {"op": "close"}                      -> {}, and the worker exits
The first line (id 0) is {"ready": true, "protocol": PROTOCOL, "vllm": version, ...} or {"error": ...} when vLLM
cannot be imported or cannot load the model. An answer is {"error": "..."} when the request failed; an error of
the engine itself adds "fatal": true and the worker exits (its state may be inconsistent: the client starts a
new one or stops the run). When its parent is gone (bebop killed, even with SIGKILL: the channel ends without a
close, or the worker is re-parented while vLLM works) the worker removes the paths in "cleanup" (the weights
directory bebop made for it) and exits with its process group.

The log-probs are of the distribution vLLM sampled from (logprobs_mode="processed_logprobs": after
temperature, top-k and top-p), the sampler's log-probs a truncated importance weight needs. vLLM's own
stop rules are off (ignore_eos): the stop ids given are the whole stop set, as on bebop's engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback

PROTOCOL = 3  # the client checks it in the first reply
PARENT_POLL_S = 0.5
WEIGHT_TRANSFER = "bebop_shm"  # shim/bebop_weight_transfer.py's engine, which make_llm registers


class StartError(Exception):
    """The worker cannot serve: its message is the first reply's error."""


def watch_parent(parent: int, cleanup: list[str]) -> None:
    """A thread that, once `parent` is no longer this process's parent (it died: the worker was re-parented),
    removes `cleanup` and kills the worker's process group (vLLM's own subprocesses with it). A thread, not the
    kernel's parent-death signal: that signal follows the thread that started the worker, not the process."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)
        if os.getpgrp() == os.getpid():  # the group's leader, as the client starts it
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="bebop-parent-watch", daemon=True).start()


def serve(config: dict, start, handlers: dict) -> int:
    """The protocol: `start(config)` -> (state, the first reply's fields) or StartError; then each request's
    answer from `handlers[op](state, request)` until the client closes the channel or the engine fails."""
    replies = os.fdopen(config["replies_fd"], "w", encoding="utf-8")
    requests = os.fdopen(config["requests_fd"], "r", encoding="utf-8")
    sys.stdout = sys.stderr  # Python's prints go to the log like everything else

    def reply(request_id: int, answer: dict) -> None:
        replies.write(json.dumps({"id": request_id, **answer}) + "\n")
        replies.flush()

    if config.get("parent"):
        watch_parent(config["parent"], config.get("cleanup") or [])
    try:
        state, hello = start(config)
    except StartError as exc:
        reply(0, {"error": str(exc)})
        return 1
    reply(0, {"ready": True, "protocol": PROTOCOL, **hello})
    for line in requests:
        ask = json.loads(line)
        if ask.get("op") == "close":
            reply(ask["id"], {})
            return 0
        handler = handlers.get(ask.get("op"))
        if handler is None:
            reply(ask.get("id", -1), {"error": f"unknown request {ask.get('op')!r}"})
            continue
        try:
            answer = handler(state, ask)
        except Exception as exc:  # the engine failed: a state that may be inconsistent is not served on
            traceback.print_exc()
            reply(ask["id"], {"error": f"vLLM {ask['op']}: {type(exc).__name__}: {exc}", "fatal": True})
            return 1
        reply(ask["id"], answer)
    for path in config.get("cleanup") or []:  # the channel ended without a close: bebop is gone
        shutil.rmtree(path, ignore_errors=True)
    return 0


def llm_arguments(config: dict, cpu: bool) -> dict:
    """vllm.LLM's arguments for the worker's config on this platform. On CPU: eager (its graphs compile slowly and
    gain little here), and prompts prefilled whole: per-request seeds (bebop seeds every row) and chunked prefill do
    not mix there (a partly prefilled request's sampled token is discarded and its generator rewound with
    set_offset, which a CPU generator does not have: "CPU Generator does not use offset"). On a GPU: CUDA graphs
    (unless enforce_eager is asked for), the share of the device's memory vLLM may take, and sleep mode when asked
    (the suspend and resume requests)."""
    eager = config.get("enforce_eager")
    args = {"model": config["model"], "dtype": config.get("dtype", "auto"), "seed": config.get("seed", 0),
            "skip_tokenizer_init": True, "max_model_len": config.get("max_model_len"),
            "enforce_eager": cpu if eager is None else eager, "logprobs_mode": "processed_logprobs",
            "max_num_seqs": config.get("max_num_seqs", 256), "disable_log_stats": False,
            "weight_transfer_config": {"backend": WEIGHT_TRANSFER}}
    if cpu:
        args["enable_chunked_prefill"] = False
    else:
        args["gpu_memory_utilization"] = config.get("gpu_memory_utilization") or 0.9
        if config.get("sleep_mode"):
            args["enable_sleep_mode"] = True
    if config.get("enable_prefix_caching") is not None:
        args["enable_prefix_caching"] = config["enable_prefix_caching"]
    if config.get("speculative_config"):
        args["speculative_config"] = config["speculative_config"]
    if config.get("mamba_ssm_cache_dtype"):  # a hybrid's recurrent states: bebop's state_dtype, not vLLM's "auto"
        args["mamba_ssm_cache_dtype"] = config["mamba_ssm_cache_dtype"]
    return args


def make_llm(config: dict):
    from bebop_weight_transfer import BACKEND, register
    from vllm import LLM
    from vllm.platforms import current_platform

    assert BACKEND == WEIGHT_TRANSFER
    register()  # the shared-memory weight updates: a weight-transfer engine of vLLM's
    return LLM(**llm_arguments(config, current_platform.is_cpu()))


def generate(llm, ask: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(temperature=p["temperature"], top_k=p.get("top_k") or 0, top_p=p.get("top_p", 1.0),
                             max_tokens=p["max_tokens"], stop_token_ids=p.get("stop_token_ids") or [],
                             ignore_eos=True, seed=p.get("seed"), logprobs=0, detokenize=False)
              for p in ask["params"]]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in ask["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    rows = []
    for out in outputs:
        c = out.outputs[0]
        logprobs = [step[token].logprob for step, token in zip(c.logprobs or [], c.token_ids)]
        rows.append({"token_ids": list(c.token_ids), "logprobs": logprobs, "finish_reason": c.finish_reason})
    return {"outputs": rows}


def update(llm, ask: dict) -> dict:
    """The target's tensors, then the drafter's, each loaded in a weight-update session of vLLM's from the shared
    file (the draft session targets the drafter with the draft model's config)."""
    start = time.perf_counter()
    for begin, tensors in (("start_weight_update", ask["target"]), ("start_draft_weight_update", ask["draft"])):
        if tensors:
            llm.collective_rpc(begin)
            llm.collective_rpc("update_weights", args=({"path": ask["path"], "tensors": tensors},))
            llm.collective_rpc("finish_weight_update")
    if ask["target"] or ask["draft"]:
        llm.reset_prefix_cache()
    return {"seconds": time.perf_counter() - start}


def suspend(llm, ask: dict) -> dict:
    """Sleep mode, level 1: the KV cache freed and the weights moved to host memory, for the trainer's update."""
    llm.sleep(level=1)
    return {}


def resume(llm, ask: dict) -> dict:
    llm.wake_up()
    return {}


def metrics(llm, ask: dict) -> dict:
    counters = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            counters[m.name.removeprefix("vllm:")] = list(m.values) if hasattr(m, "values") else m.value
    return {"counters": counters}


HANDLERS = {"generate": generate, "update": update, "suspend": suspend, "resume": resume, "metrics": metrics}


def start_vllm(config: dict):
    """vLLM imported (with the shim and bebop's fixes) and the model loaded -> (the LLM, the first reply's fields)."""
    for key, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                       ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):  # in-process: collective_rpc takes functions
        os.environ.setdefault(key, value)
    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
    os.environ["PYTHONPATH"] = os.pathsep.join([shim, *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path.insert(0, shim)  # here and in vLLM's own subprocesses (its model inspection): shim/sitecustomize.py
    try:
        import bebop_torchvision_shim
        if bebop_torchvision_shim.NOTE:
            print(f"bebop vLLM worker: {bebop_torchvision_shim.NOTE}", file=sys.stderr)
        import vllm
        from bebop_vllm_fixes import apply as apply_fixes
        from bebop_vllm_fixes import settle
    except Exception as exc:  # not installed, or a wheel that does not import beside this torch
        raise StartError(f"cannot import vllm in {sys.executable}: {type(exc).__name__}: {exc}") from exc
    fixed = [] if os.environ.get("BEBOP_VLLM_NO_FIXES") else apply_fixes()  # unset: to see vLLM as shipped
    for fix in fixed:
        print(f"bebop vLLM worker: fixed {fix}", file=sys.stderr)
    try:
        llm = make_llm(config)
    except Exception as exc:
        raise StartError(f"vLLM {vllm.__version__} cannot run {config['model']}: {type(exc).__name__}: {exc}") from exc
    broken = settle()  # vLLM's own expand checked now that its overrides are in: a right one is put back
    if broken is False:
        print("bebop vLLM worker: this vLLM computes the rejection sampler's expand right: its own is used",
              file=sys.stderr)
    return llm, {"vllm": vllm.__version__, "fixes": list(fixed), "expand_was_broken": broken}


def main() -> None:
    sys.exit(serve(json.loads(sys.argv[1]), start_vllm, HANDLERS))


if __name__ == "__main__":
    main()
