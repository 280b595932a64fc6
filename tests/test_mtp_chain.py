"""The training chain computes exactly what cached drafting computes (teacher-forced tokens)."""

import pytest
import torch

from bebop.model import load_model
from bebop.mtp.chain import chain_forward, shifted


@pytest.mark.parametrize("num_layers", [1, 2])
def test_chain_equals_cached_drafting(hf_model_dir, num_layers):
    _, path = hf_model_dir
    model = load_model(path)
    model.attach_mtp(num_layers, torch.Generator().manual_seed(0))
    head = model.mtp
    depths, length = 4, 24
    x = torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = model(x)  # (1, T, H)
        outs = chain_forward(head, hidden, [model.embed(shifted(x, d, 0)) for d in range(1, depths + 1)])
        for t in (0, 5, length - depths - 1):
            cache = head.new_cache(1, 64, dtype=model.dtype, device=model.device)
            out = head(hidden[:, : t + 1], model.embed(x[:, 1: t + 2]), 1, cache, torch.tensor([t + 1]))[:, -1]
            assert torch.allclose(out, outs[0][:, t], atol=1e-5)
            for d in range(2, depths + 1):
                out = head(out[:, None], model.embed(x[:, t + d: t + d + 1]), d, cache, torch.tensor([1]))[:, 0]
                assert torch.allclose(out, outs[d - 1][:, t], atol=1e-5), (t, d)
