"""A policy and head built by hand over two tokens, whose speculative acceptance is known in closed form.

    model = markov_model(target=[[0.5, 0.5], [0.5, 0.5]], draft=[[1.0, 0.0], [0.5, 0.5]])
    markov_mean_length(tables(model), k=3, mode="rs")   # 2.9605...: what the engine measures in the long run

Every layer's output projections are zero, so each decoder layer is the identity and both distributions
depend on the previous token only: the target p(. | s) = target[s] and the head's q(. | s) = draft[s] at every
depth (its hidden input is ignored: the hidden half of fc is zero). Token 0 is A, token 1 is B. The head is sure
after some tokens and unsure after others, so acceptance at a step's start depends on the token before it:
the case where weighting starts by the chain's acceptance law alone is biased (docs/method.md section 8).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bebop.model.config import ModelConfig
from bebop.model.qwen3 import CausalLM

HIDDEN = 8  # e0, e1: the tokens' embeddings; e2, e3: the head's outputs after A and B
SURE = 60.0  # a logit gap standing for probability 1 (e^-60 ~ 1e-26)


def _logit(prob: float) -> float:
    """P(A) -> the logit gap A - B (B's logit is 0)."""
    if prob >= 1.0:
        return SURE
    if prob <= 0.0:
        return -SURE
    return math.log(prob / (1 - prob))


def markov_model(target: list[list[float]], draft: list[list[float]]) -> CausalLM:
    """target[s][v], draft[s][v]: P(next = v | previous = s) for the trunk and for the MTP head."""
    cfg = ModelConfig(vocab_size=2, hidden_size=HIDDEN, intermediate_size=HIDDEN, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=HIDDEN, max_position_embeddings=4096,
                      mtp_num_hidden_layers=1)
    model = CausalLM(cfg)
    model.init_weights(torch.Generator().manual_seed(0))
    scale = math.sqrt(HIDDEN)  # a unit vector after an RMSNorm of unit weight
    with torch.no_grad():
        for layer in [*model.model.layers, *model.mtp.layers]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[0, 0] = model.model.embed_tokens.weight[1, 1] = 1.0
        head = model.lm_head.weight  # (V, H): B's row zero, A's row reads the four directions
        head.zero_()
        for s in (0, 1):
            head[0, s] = _logit(target[s][0]) / scale  # the trunk's normed hidden after s is scale * e_s
            head[0, 2 + s] = _logit(draft[s][0]) / scale  # the head's normed output after s is scale * e_{2+s}
        fc = model.mtp.fc.weight  # (H, 2H): [embedding half | hidden half]
        fc.zero_()
        fc[2, 0] = fc[3, 1] = 1.0
    return model.eval()


@torch.no_grad()
def tables(model: CausalLM) -> tuple[np.ndarray, np.ndarray]:
    """The model's own (target, draft) tables (2, 2), read off one forward per previous token."""
    ids = torch.tensor([[0], [1]])
    hidden = model(ids)  # (2, 1, H)
    mtp = model.require_mtp()
    cache = mtp.new_cache(2, 2, dtype=model.dtype, device=model.device)
    head = mtp(hidden, model.embed(ids), 1, cache, torch.ones(2, dtype=torch.long))  # (2, 1, H)
    target = torch.softmax(model.logits(hidden[:, 0]), -1).double().numpy()
    draft = torch.softmax(model.mtp_logits(head[:, 0]), -1).double().numpy()
    return target, draft


def _rules(p: np.ndarray, q: np.ndarray, s: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """After token s: (the law of an accepted draft, unnormalised; the law of what a rejection emits)."""
    if mode == "rs":
        return np.minimum(p[s], q[s]), np.maximum(p[s] - q[s], 0.0)
    guess = int(np.argmax(q[s]))
    accepted = np.zeros_like(p[s])
    accepted[guess] = p[s, guess]
    return accepted, p[s] - accepted


def step_law(p: np.ndarray, q: np.ndarray, k: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """One speculative step from each start token s: (next start's law (V, V), expected emitted tokens (V,))."""
    vocab = len(p)
    moves, emitted = np.zeros((vocab, vocab)), np.zeros(vocab)
    for s0 in range(vocab):
        mass = np.eye(vocab)[s0]  # over the last token, having accepted d drafts
        for d in range(k):
            nxt = np.zeros(vocab)
            for s in range(vocab):
                accepted, rejected = _rules(p, q, s, mode)
                nxt += mass[s] * accepted
                moves[s0] += mass[s] * rejected
                emitted[s0] += mass[s] * rejected.sum() * (d + 1)
            mass = nxt
        moves[s0] += mass @ p  # all k accepted: a bonus token from the target
        emitted[s0] += mass.sum() * (k + 1)
    return moves, emitted


def markov_mean_length(model_tables: tuple[np.ndarray, np.ndarray], k: int, mode: str) -> float:
    """The engine's long-run mean acceptance length: the step law's expected emitted tokens at its stationary
    start distribution."""
    moves, emitted = step_law(*model_tables, k, mode)
    values, vectors = np.linalg.eig(moves.T)
    stationary = np.real(vectors[:, np.argmin(abs(values - 1))])
    return float(stationary @ emitted / stationary.sum())


def renewal_mean_length(model_tables: tuple[np.ndarray, np.ndarray], k: int, mode: str) -> float:
    """What weighting each start by the chain's acceptance law alone converges to on on-policy sequences: a step
    accepting a drafts moves the start a + 1 tokens along the target's own chain, whatever the tokens."""
    p, q = model_tables
    vocab = len(p)
    moves, emitted = np.zeros((vocab, vocab)), np.zeros(vocab)
    for s0 in range(vocab):
        mass = np.eye(vocab)[s0]
        for a in range(k + 1):
            nxt, stop = np.zeros(vocab), 0.0
            for s in range(vocab):
                accepted, _ = _rules(p, q, s, mode)
                nxt += mass[s] * accepted
                stop += mass[s] * (1.0 - accepted.sum())
            if a == k:
                stop = mass.sum()
            moves[s0] += stop * np.linalg.matrix_power(p, a + 1)[s0]
            emitted[s0] += stop * (a + 1)
            mass = nxt
    values, vectors = np.linalg.eig(moves.T)
    stationary = np.real(vectors[:, np.argmin(abs(values - 1))])
    return float(stationary @ emitted / stationary.sum())
