"""A stand-in for bebop/vllm/worker.py that needs no vLLM: the real worker's protocol (`serve`) with handlers that
misbehave on request, for the boundary tests (tests/test_vllm_boundary.py).

    python fake_vllm_worker.py CONFIG_JSON      # as the client runs worker.py
    BEBOP_FAKE_VLLM='{"start_s": 5, "vllm": "0.10.0", "protocol": 1, "fail_start": "why"}'   # optional, its start
"""

import json
import os
import sys
import time

from bebop.vllm import worker


def start(config: dict):
    fake = json.loads(os.environ.get("BEBOP_FAKE_VLLM") or "{}")
    if fake.get("fail_start"):
        raise worker.StartError(fake["fail_start"])
    time.sleep(fake.get("start_s", 0))
    return {"generated": 0, "updates": []}, {"vllm": fake.get("vllm", "0.32.0"), "fixes": [], "expand_was_broken": False,
                              **({"protocol": fake["protocol"]} if "protocol" in fake else {})}


def generate(state: dict, ask: dict) -> dict:
    state["generated"] += 1
    return {"outputs": [{"token_ids": [len(p)], "logprobs": [0.0], "finish_reason": "length"} for p in ask["prompts"]]}


def sleep(state: dict, ask: dict) -> dict:
    """Sleeps `seconds`; with `once` (a path), only the first time any worker is asked (a restarted one answers)."""
    once = ask.get("once")
    if once and os.path.exists(once):
        return {"slept": 0}
    if once:
        open(once, "w").close()
    time.sleep(ask["seconds"])
    return {"slept": ask["seconds"]}


def native_print(state: dict, ask: dict) -> dict:
    os.write(1, b'{"id": 99, "garbage": true}\nnot json either\n')  # what C code printing to stdout does
    return {"printed": True}


def crash(state: dict, ask: dict) -> dict:
    raise RuntimeError("the engine broke")


def pid(state: dict, ask: dict) -> dict:
    return {"pid": os.getpid(), "generated": state["generated"], "updates": state["updates"]}


def update(state: dict, ask: dict) -> dict:
    """Records the names of each update (the real worker loads them from the shared file)."""
    state["updates"].append([entry[0] for entry in ask["target"] + ask["draft"]])
    return {"seconds": 0.0}


HANDLERS = {"generate": generate, "update": update, "sleep": sleep, "native_print": native_print, "crash": crash, "pid": pid,
            "metrics": lambda state, ask: {"counters": {"spec_decode_num_drafts": state["generated"]}}}

if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    sys.exit(worker.serve(config, start, HANDLERS))
