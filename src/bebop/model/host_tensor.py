"""A decoding step's few host numbers as a tensor on the model's device: token ids, lengths, masks.

    ids = host_tensor([[5, 0], [7, 8]], device)             # (2, 2) int64
    drafting = host_tensor([True, False], device, torch.bool)  # (2,)

torch.tensor converts a Python list element by element (about 3 us for eight numbers, 14 us for an 8 x 12
nested list); numpy converts it in about a third of that, and torch takes numpy's buffer as it is. A step sends
several such lists, so this is the one place they become tensors."""

from __future__ import annotations

import numpy as np
import torch

_NUMPY = {torch.long: np.int64, torch.bool: np.bool_}


def host_tensor(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A flat or rectangular nested list of ints (or bools) -> a tensor of its shape on `device`."""
    return torch.from_numpy(np.array(values, dtype=_NUMPY[dtype])).to(device)
