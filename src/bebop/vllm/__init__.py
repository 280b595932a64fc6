"""vLLM as a rollout engine behind a process boundary bebop owns (`--engine vllm`): worker.py runs in the
Python that has vLLM, client.py talks to it, engine.py puts it behind bebop's generate interface, serve.py
keeps it serving a training model's current weights."""
