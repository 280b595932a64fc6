"""The learner past one device (torch.distributed): one process per rank, each taking its share of every batch.

    world = init_world(device)                      # world.py: rank, size, device; gloo on CPU, NCCL on GPUs
    par = Parallel(world, "fsdp", model, Logits(model))   # parallel.py: DDP or FSDP2 (fully_shard)
    for last, chunk in par.chunks(chunks): (loss * par.loss_scale).backward()   # DDP syncs after the last

Launch: `--nproc N` on sft, mtp train and rl re-runs the command as N ranks (launch.py: torch's elastic
launcher, the engine behind torchrun), or `torchrun --nproc-per-node N -m bebop ...` directly.
"""

from bebop.distributed.world import World, env_world, init_world

__all__ = ["World", "env_world", "init_world"]
