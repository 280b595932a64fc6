"""The training chain computes exactly what cached drafting computes (teacher-forced tokens)."""

import pytest
import torch

from bebop.model import load_model
from bebop.mtp.chain import chain_forward, shifted


def _chains(hf_model_dir, num_layers: int, depths: int, length: int, seed: int):
    """The tiny model with a fresh head, a random sequence x (1, T), its trunk hiddens (1, T, H) and
    the teacher-forced chain outputs (depths x (1, T, H))."""
    _, path = hf_model_dir
    model = load_model(path)
    model.attach_mtp(num_layers, torch.Generator().manual_seed(0))
    x = torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hidden = model(x)  # (1, T, H)
        outs = chain_forward(model.mtp, hidden, [model.embed(shifted(x, d, 0)) for d in range(1, depths + 1)])
    return model, x, hidden, outs


@pytest.mark.parametrize("num_layers", [1, 2])
def test_chain_equals_cached_drafting(hf_model_dir, num_layers):
    depths, length = 4, 24
    model, x, hidden, outs = _chains(hf_model_dir, num_layers, depths, length, seed=1)
    head = model.mtp
    with torch.no_grad():
        for t in (0, 5, length - depths - 1):
            cache = head.new_cache(1, 64, dtype=model.dtype, device=model.device)
            out = head(hidden[:, : t + 1], model.embed(x[:, 1: t + 2]), 1, cache, torch.tensor([t + 1]))[:, -1]
            assert torch.allclose(out, outs[0][:, t], atol=1e-5)
            for d in range(2, depths + 1):
                out = head(out[:, None], model.embed(x[:, t + d: t + d + 1]), d, cache, torch.tensor([1]))[:, 0]
                assert torch.allclose(out, outs[d - 1][:, t], atol=1e-5), (t, d)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_one_cache_through_rounds_of_refresh_draft_and_rollback_equals_the_chains(hf_model_dir, num_layers):
    """As the engine uses it: one cache for the whole sequence; each round refreshes the positions
    made valid since the last (1 to 5 of them, ragged), drafts depths 2..D (speculative entries past
    the valid length), then rolls back to the valid length. Every draft equals the teacher-forced chain."""
    depths, length = 4, 32
    model, x, hidden, outs = _chains(hf_model_dir, num_layers, depths, length, seed=2)
    head = model.mtp
    with torch.no_grad():
        cache = head.new_cache(1, 64, dtype=model.dtype, device=model.device)
        valid, rounds = 0, 0
        for step in [1, 3, 1, 4, 2, 5, 1, 2, 3]:
            t = valid + step - 1  # the last position this round makes valid
            if t + depths >= length:
                break
            out = head(hidden[:, valid: t + 1], model.embed(x[:, valid + 1: t + 2]), 1, cache,
                       torch.tensor([step]))[:, -1]  # refresh over `step` positions, depth 1 at t
            assert torch.allclose(out, outs[0][:, t], atol=1e-5), (t, 1)
            for d in range(2, depths + 1):
                out = head(out[:, None], model.embed(x[:, t + d: t + d + 1]), d, cache, torch.tensor([1]))[:, 0]
                assert torch.allclose(out, outs[d - 1][:, t], atol=1e-5), (t, d)
            valid = t + 1
            cache.rollback(torch.tensor([valid]), span=valid)  # drop the speculative chain entries
            rounds += 1
    assert rounds >= 6
