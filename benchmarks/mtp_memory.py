"""Peak memory of ONE MTP training step (issue 16, part 5): the chain loss from full distributions (the
trainer before) against the loss from hidden states (bebop.losses.hidden, what `bebop mtp train` runs
now), at a real vocabulary (V = 151,936) and at the embedded default's size; and the step time of both
at both sizes (the fused path computes the LM head's logits and targets twice: forward and backward).

    .venv/bin/python benchmarks/mtp_memory.py [--batch 4] [--length 256] [--depths 3] [--hidden 256]
        [--layers 2] [--time-runs 11] [--time-runs-real 5] [--device cpu|cuda] [--out benchmarks/results/mtp_memory-DATE.json]

Random weights (memory and time do not depend on their values), float32, one MTP layer, a (B, T)
batch of random tokens whose chains are all kept but the last D positions. One step = the trunk
under no_grad, the head's teacher-forced chain over D depths, the draft loss (e2e_tv) and its
backward into the head's parameters. Memory is the peak of what the step allocates on top of the
model and the batch: torch.cuda.max_memory_allocated on CUDA; on the CPU the allocator's running
total read from torch's profiler (common.peak_cpu_bytes). Arms, per model:

  full   the pre-fusion trainer, as it was: softmax(trunk logits) (B, T, V), stacked (B, T, D, V)
         targets and draft logits, draft_loss (whose backward makes the (N, D, V) gradient)
  fused  bebop.mtp.train.chain_step: never a (B, T, V) or (N, D, V) tensor
  floor  the same chain with a loss that needs no logits (the head's outputs times a fixed tensor):
         the activations, (B, T, H)-sized, and the head's gradients that every arm pays

'fused - floor' is the loss's own extra memory. One chunk's working set is measured as the peak of
the fused loss alone over exactly one chunk of chains (chunk * D * V * 4 bytes per float32
temporary, times the live temporaries); the issue's target: fused - floor <= 2x that.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from bebop.embedded import default_config
from bebop.fileio import atomic_write_text
from bebop.losses import DraftHiddenInputs, DraftLossInputs, draft_loss, draft_loss_from_hidden
from bebop.model.checkpoint import build_model
from bebop.mtp.chain import chain_forward, shifted
from bebop.mtp.train_config import MTPTrainConfig
from bebop.mtp.train_step import ChainBatch, chain_hidden, chain_step, freeze_trunk, loss_chunk_size
from bebop.policy import Policy, resolve_device
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, peak_cpu_bytes, timed  # noqa: E402

REAL_VOCAB = 151_936  # Qwen3 / Qwen3.5


def full_distribution_loss(policy: Policy, batch: ChainBatch, cfg: MTPTrainConfig, name: str):
    """The trainer before fusion, as it was: softmax(model.logits(hidden) / T) over (B, T, V), shifted
    per depth, against the stacked mtp_logits / T (B, T, D, V), through draft_loss."""
    model, d = policy.model, cfg.depths
    with torch.no_grad():
        hidden = model(batch.ids)  # (B, T, H)
        target = torch.softmax(model.logits(hidden) / cfg.temperature, dim=-1)  # (B, T, V)
        targets = torch.stack([shifted(target, i, 0) for i in range(1, d + 1)], dim=2)  # (B, T, D, V)
        embeds = [model.embed(shifted(batch.ids, i, policy.pad_id)) for i in range(1, d + 1)]
    outs = chain_forward(model.require_mtp(), hidden, embeds)
    logits = torch.stack([model.mtp_logits(o) for o in outs], dim=2) / cfg.temperature  # (B, T, D, V)
    v = logits.shape[-1]
    inputs = DraftLossInputs(logits.reshape(-1, d, v), targets.reshape(-1, d, v), batch.keep.reshape(-1))
    return draft_loss(name, inputs, chunk_size=loss_chunk_size(d, v))


def build(vocab: int | None, hidden: int, layers: int, device: torch.device) -> Policy:
    """A random policy with a fresh head: the embedded default (vocab None), or a small trunk with `vocab`."""
    codec = codec_from_tokenizer(build_char_tokenizer())
    if vocab is None:
        cfg = default_config(codec.vocab_size, codec.eos_id, codec.pad_id)
    else:
        cfg = default_config(vocab, codec.eos_id, codec.pad_id, hidden_size=hidden, intermediate_size=3 * hidden,
                             num_hidden_layers=layers, head_dim=hidden // 4)
    model = build_model(cfg, seed=0).to(device)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    return Policy(model, codec)


def make_chains(policy: Policy, b: int, t: int, depths: int) -> ChainBatch:
    device = policy.model.device
    ids = torch.randint(0, policy.model.config.vocab_size, (b, t), generator=torch.Generator().manual_seed(1))
    keep = (torch.arange(t) + depths < t).expand(b, t).clone()  # (B, T): every chain inside the sequence
    return ChainBatch(ids.to(device), keep.to(device))


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    if device.type != "cuda":
        return peak_cpu_bytes(fn)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def arms(policy: Policy, batch: ChainBatch, cfg: MTPTrainConfig) -> dict[str, Callable[[], None]]:
    """name -> one step (loss forward + backward into the head's freshly zeroed gradients)."""
    params = freeze_trunk(policy)
    probe = torch.randn(batch.ids.numel(), cfg.depths, policy.model.config.hidden_size,
                        generator=torch.Generator().manual_seed(2)).to(policy.model.device)  # (N, D, H)
    losses = {"full": lambda: full_distribution_loss(policy, batch, cfg, cfg.loss).loss,
              "fused": lambda: chain_step(policy, batch, cfg).loss,
              "floor": lambda: (chain_hidden(policy, batch, cfg.depths, cfg.temperature).draft_hidden * probe).sum()}

    def step(loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for p in params:
                p.grad = None
            loss().backward()
        return run

    return {name: step(loss) for name, loss in losses.items()}


def chunk_working_set(policy: Policy, cfg: MTPTrainConfig, chains: int) -> dict:
    """The fused loss alone over exactly one chunk of chains (at most `chains`, the step's kept chains):
    its peak is one chunk's working set."""
    model = policy.model
    v, h = model.config.vocab_size, model.config.hidden_size
    chunk = min(loss_chunk_size(cfg.depths, v), chains)
    g = torch.Generator().manual_seed(3)
    draft = torch.randn(chunk, cfg.depths, h, generator=g).to(model.device).requires_grad_()  # (c, D, H)
    target = torch.randn(chunk, cfg.depths, h, generator=g).to(model.device)  # (c, D, H)
    inputs = DraftHiddenInputs(draft, target, model.lm_head.weight, cfg.temperature)
    peak = peak_bytes(lambda: draft_loss_from_hidden(cfg.loss, inputs, chunk_size=chunk).loss.backward(), model.device)
    temp = chunk * cfg.depths * v * 4
    return {"chunk_chains": chunk, "temporary_bytes": temp, "working_set_bytes": peak,
            "live_temporaries": round(peak / temp, 2)}


def measure_memory(name: str, policy: Policy, args: argparse.Namespace, cfg: MTPTrainConfig) -> dict:
    batch = make_chains(policy, args.batch, args.length, args.depths)
    steps = arms(policy, batch, cfg)
    peaks = {arm: peak_bytes(run, policy.model.device) for arm, run in steps.items()}
    work = chunk_working_set(policy, cfg, int(batch.keep.sum()))
    v, n = policy.model.config.vocab_size, args.batch * args.length
    extra = peaks["fused"] - peaks["floor"]
    return {"model": name, "vocab": v, "hidden": policy.model.config.hidden_size,
            "layers": policy.model.config.num_hidden_layers, "chains": n, "depths": args.depths,
            "model_bytes": sum(p.numel() * p.element_size() for p in policy.model.parameters()),
            "full_ndv_float32_bytes": n * args.depths * v * 4, "peak_bytes": peaks, "fused_extra_bytes": extra,
            "full_extra_bytes": peaks["full"] - peaks["floor"], "full_over_fused": round(peaks["full"] / peaks["fused"], 2),
            "chunk": work, "fused_extra_over_working_set": round(extra / work["working_set_bytes"], 2),
            "target_met": extra <= 2 * work["working_set_bytes"]}


def measure_time(policy: Policy, args: argparse.Namespace, cfg: MTPTrainConfig, runs: int) -> dict:
    """`runs` alternating full / fused steps after a warm-up; medians and the median of per-pair ratios."""
    batch = make_chains(policy, args.batch, args.length, args.depths)
    steps = arms(policy, batch, cfg)
    for arm in ("full", "fused"):
        steps[arm]()
    sync = torch.cuda.synchronize if policy.model.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"full": [], "fused": []}
    for i in range(runs):
        for arm in (("full", "fused") if i % 2 == 0 else ("fused", "full")):
            times[arm].append(timed(lambda: (steps[arm](), sync())))
    ratios = [f / o for f, o in zip(times["fused"], times["full"])]
    return {"runs": runs, "full_s": [round(x, 4) for x in times["full"]],
            "fused_s": [round(x, 4) for x in times["fused"]], "full_median_s": round(statistics.median(times["full"]), 4),
            "fused_median_s": round(statistics.median(times["fused"]), 4),
            "fused_over_full_median_ratio": round(statistics.median(ratios), 3),
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--depths", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256, help="of the real-vocabulary model")
    p.add_argument("--layers", type=int, default=2, help="of the real-vocabulary model")
    p.add_argument("--vocab", type=int, default=REAL_VOCAB)
    p.add_argument("--time-runs", type=int, default=11, help="timed steps per arm at the embedded default")
    p.add_argument("--time-runs-real", type=int, default=5, help="timed steps per arm at the real vocabulary")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=f"benchmarks/results/mtp_memory-{datetime.date.today()}.json")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    cfg = MTPTrainConfig(loss="e2e_tv", depths=args.depths, temperature=1.0)
    report: dict = {"machine": machine() if device.type == "cpu" else torch.cuda.get_device_name(device),
                    "date": str(datetime.date.today()), "device": str(device), "loss": cfg.loss,
                    "batch": args.batch, "length": args.length, "depths": args.depths, "memory": []}
    for name, vocab in (("real-vocab", args.vocab), ("embedded-default", None)):
        policy = build(vocab, args.hidden, args.layers, device)
        report["memory"].append(measure_memory(name, policy, args, cfg))
        print(json.dumps(report["memory"][-1]), flush=True)
        runs = args.time_runs if vocab is None else args.time_runs_real
        if runs:
            report.setdefault("time", {})[name] = measure_time(policy, args, cfg, runs)
            print(json.dumps({"time": name, **report["time"][name]}), flush=True)
        del policy
    atomic_write_text(Path(args.out), json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
