"""One training step of the MTP head (docs/method.md section 4): sequences -> teacher-forced chains (ChainBatch), the
trunk's hiddens under no_grad, the head's chain over `depths` depths (DraftChains, the module the learner wraps) and
the draft loss from hidden states, a chunk of chains at a time (no (B, T, V) or (N, D, V) tensor).

Chains are kept only where they lie wholly inside a completion's policy tokens (never in the prompt, padding or an
environment observation); the target for depth d at chain t is the trunk's distribution at position t + d at the
training temperature."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bebop.losses import DraftHiddenInputs, DraftLossInputs, draft_loss_from_hidden
from bebop.model.qwen3 import CausalLM
from bebop.mtp.chain import chain_forward, shifted
from bebop.mtp.data import Sequence
from bebop.mtp.train_config import MTPTrainConfig
from bebop.policy import Policy

LOSS_CHUNK_FLOATS = 1 << 22  # loss temporaries per chunk: ~16 MB of float32 (5 chains at K=5, V=151k)


@dataclass
class ChainBatch:
    ids: torch.Tensor  # (B, T) right-padded sequences
    keep: torch.Tensor  # (B, T) bool: chain starts that are trained


def make_batch(seqs: list[Sequence], depths: int, pad_id: int) -> ChainBatch:
    """Pad sequences; keep chain t iff positions t+1..t+depths are policy completion tokens."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    trainable = torch.zeros(len(seqs), width + depths, dtype=torch.bool)  # position is a policy token
    for b, s in enumerate(seqs):
        ids[b, : len(s.ids)] = torch.tensor(s.ids)
        p = len(s.prompt_ids)
        trainable[b, p: p + len(s.completion_ids)] = ~torch.tensor(s.env_mask, dtype=torch.bool)
    keep = torch.ones(len(seqs), width, dtype=torch.bool)
    for d in range(1, depths + 1):
        keep &= trainable[:, d: d + width]
    return ChainBatch(ids, keep)


def loss_at(step: int, cfg: MTPTrainConfig) -> str:
    """The draft loss used at `step` (0-based): ce during the warm-up, then cfg.loss."""
    return "ce" if step < cfg.ce_warmup_steps else cfg.loss


class DraftChains(torch.nn.Module):
    """The training forward of the head as one module (what DDP and FSDP2 wrap): ids (B, T) -> the head's chain
    outputs (gradient into the head only) and the trunk's states at the target positions (detached), (B, T, D, H)
    each after their norms, and the shared LM head's weight (V, H). The target for depth d at chain t is the
    trunk's state (hence distribution) at position t+d."""

    def __init__(self, model: CausalLM, depths: int, pad_id: int) -> None:
        super().__init__()
        self.model, self.depths, self.pad_id = model, depths, pad_id

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model, depths = self.model, self.depths
        with torch.no_grad():
            hidden = model(ids)  # (B, T, H) after the final norm
            targets = torch.stack([shifted(hidden, d, 0) for d in range(1, depths + 1)], dim=2)  # (B, T, D, H)
            embeds = [model.embed(shifted(ids, d, self.pad_id)) for d in range(1, depths + 1)]
        drafts = torch.stack(chain_forward(model.require_mtp(), hidden, embeds), dim=2)  # (B, T, D, H)
        return drafts, targets, model.lm_head.weight


def chain_hidden(policy: Policy, batch: ChainBatch, depths: int, temperature: float,
                 forward: torch.nn.Module | None = None) -> DraftHiddenInputs:
    """Every chain of the batch at depths 1..D as hidden states (DraftChains; `forward`: the learner's wrapped
    one) -> (N, D, H) each, with the shared LM head and keep (N,)."""
    model = policy.model
    forward = forward or DraftChains(model, depths, policy.pad_id)
    drafts, targets, lm_head = forward(batch.ids.to(model.device))
    h = drafts.shape[-1]
    # model.logits and model.mtp_logits are both lm_head(x).float(): a bias-free product, no softcap or scale
    return DraftHiddenInputs(drafts.reshape(-1, depths, h), targets.reshape(-1, depths, h), lm_head,
                             temperature, batch.keep.to(model.device).reshape(-1))


def chain_distributions(policy: Policy, batch: ChainBatch, depths: int, temperature: float) -> DraftLossInputs:
    """`chain_hidden` as full distributions: the head's logits and the trunk's probabilities, (N, D, V) each,
    keep (N,). For small evaluation batches (diagnostics); training goes through `chain_step`, which never
    makes an (N, D, V) tensor."""
    return chain_hidden(policy, batch, depths, temperature).materialise()


def loss_chunk_size(depths: int, vocab_size: int) -> int:
    """Chains per loss chunk: about LOSS_CHUNK_FLOATS floats per (chunk, D, V) temporary."""
    return max(1, LOSS_CHUNK_FLOATS // (depths * vocab_size))


def chain_step(policy: Policy, batch: ChainBatch, cfg: MTPTrainConfig, loss: str | None = None,
               forward: torch.nn.Module | None = None):
    """The draft loss (default cfg.loss) of one batch, gradient into the head only -> DraftLossOutput.

    Fused from the hidden states (bebop.losses.hidden): the LM head's logits are recomputed chunk by
    chunk in forward and backward, never held for the whole batch."""
    inputs = chain_hidden(policy, batch, cfg.depths, cfg.temperature, forward)
    chunk = loss_chunk_size(cfg.depths, inputs.lm_head.shape[0])
    return draft_loss_from_hidden(loss or cfg.loss, inputs, chunk_size=chunk)


def freeze_trunk(policy: Policy) -> list[torch.nn.Parameter]:
    """Only mtp.* trains; returns those parameters."""
    model = policy.model
    model.requires_grad_(False)
    params = model.head_parameters()
    for p in params:
        p.requires_grad_(True)
    return params
