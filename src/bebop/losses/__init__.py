"""Draft (MTP head) losses as pure functions: ce, kl, rkl, tv, e2e_tv (docs/method.md section 4).

Per row (N, V), (N, V) -> (N,): `ce_loss`, `kl_loss`, `rkl_loss`, `tv_loss`.
Per chain (N, K, V): `draft_loss(name, DraftLossInputs) -> DraftLossOutput` (loss + per-depth TV
and acceptance) and `e2e_tv_loss` (which chains are trained: bebop.mtp.train.make_batch).
From hidden states (N, K, H) and the LM-head weight (V, H): `draft_loss_from_hidden(name,
DraftHiddenInputs)`, the same loss with the logits recomputed per chunk (what MTP training uses).
Full vocabulary, chunked over chains: extra memory is the (N, K, V) gradient plus
O(chunk_size * K * V) temporaries (see `bebop.losses.rows`); from hidden states, only the latter
(see `bebop.losses.hidden`).
"""

from bebop.losses.draft import DRAFT_LOSSES, DraftLossInputs, DraftLossOutput, draft_loss, e2e_tv_loss
from bebop.losses.hidden import DraftHiddenInputs, draft_loss_from_hidden
from bebop.losses.rows import DEFAULT_CHUNK_SIZE, RKL_TARGET_FLOOR, ce_loss, kl_loss, rkl_loss, tv_loss

__all__ = ["DEFAULT_CHUNK_SIZE", "DRAFT_LOSSES", "DraftHiddenInputs", "DraftLossInputs", "DraftLossOutput",
           "RKL_TARGET_FLOOR", "ce_loss", "draft_loss", "draft_loss_from_hidden", "e2e_tv_loss", "kl_loss", "rkl_loss",
           "tv_loss"]
