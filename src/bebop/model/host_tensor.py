"""A decoding step's few host numbers as a tensor on the model's device: token ids, lengths, masks.

    ids = host_tensor([[5, 0], [7, 8]], device)             # (2, 2) int64
    drafting = host_tensor([True, False], device, torch.bool)  # (2,)
    ids, counts = pad_chunk([[5], [7, 8]], pad_id, device)  # ragged rows right-padded: (2, 2), (2,)

torch.tensor converts a Python list element by element (about 3 us for eight numbers, 14 us for an 8 x 12
nested list); numpy converts it in about a third of that, and torch takes numpy's buffer as it is. The lists a
decoding step (and a prefill) sends each step go through here."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_NUMPY = {torch.long: np.int64, torch.bool: np.bool_}


def host_tensor(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A flat or rectangular nested list of ints (or bools) -> a tensor of its shape on `device`."""
    return torch.from_numpy(np.array(values, dtype=_NUMPY[dtype])).to(device)


def pad_chunk(pending: Sequence[Sequence[int]], pad_id: int, device: torch.device,
              width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-row token lists -> (B, T) right-padded ids, T the longest list but at least `width`, and (B,)
    counts."""
    width = max(width, max(len(p) for p in pending))
    flat = [tok for toks in pending for tok in [*toks, *[pad_id] * (width - len(toks))]]  # one host list, one tensor
    return host_tensor(flat, device).view(len(pending), width), host_tensor([len(p) for p in pending], device)
