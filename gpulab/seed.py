"""Seeding every random number generator a lab touches, so runs repeat exactly (lesson 00)."""
from __future__ import annotations

import random


def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every GPU). Returns ``seed``."""
    import numpy as np
    import torch

    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"SEED must be an int, got {type(seed).__name__} {seed!r}.")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed
