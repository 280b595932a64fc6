"""GRPO post-training whose rollouts come from the (speculative) engine, sync or async.

    bebop rl --model DIR --task math --steps 50 --out RUN_DIR [--mode async] [--spec rs --k 3]

Data flows one way, each arrow a typed record:
    task problems -> sampler (engine) -> RolloutBatch -> TrainBatch -> GRPO update
    -> (online MTP update) -> weight sync (trunk AND head) -> engine.

    grpo.py        advantages, importance weights, PPO-clipped loss: pure functions
    records.py     Rollout / RolloutBatch (each rollout carries its policy version and log-probs)
    batch.py       RolloutBatch -> padded tensors
    sampler.py     problems -> RolloutBatch with the plain or speculative engine
    trainer.py     the policy update (mtp.* excluded), optional frozen reference for KL
    mtp_online.py  online MTP strategies (none | ce | tv | e2e_tv), own optimizer, trunk untouched
    loop.py        the run: setup, resume, the step loop (sync source)
    async_loop.py  the async source: worker thread, engine copy, bounded queue, staleness
    checkpoint.py  atomic checkpoints; metrics.py: metrics.jsonl (+ TensorBoard)
"""

from bebop.rl.config import RLConfig
from bebop.rl.loop import train_rl

__all__ = ["RLConfig", "train_rl"]
