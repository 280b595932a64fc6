"""The rollout engines a run can decode with (`--engine`): bebop's own, or vLLM behind its worker process."""

ROLLOUT_ENGINES = ("bebop", "vllm")
