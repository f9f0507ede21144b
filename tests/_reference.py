"""Plain references the tests compare against (numpy/torch dense math, no sparsecomm code)."""

from __future__ import annotations

import math

import numpy as np
import torch


def ref_topk_indices(x: torch.Tensor, k: int) -> np.ndarray:
    """Indices of the k largest |x|, ties broken by the lower index, ascending."""
    mags = np.abs(x.detach().double().cpu().numpy())
    order = np.lexsort((np.arange(mags.size), -mags))  # primary: -|x|, secondary: index
    return np.sort(order[:k])


def ref_k(density: float, n: int) -> int:
    return 0 if n == 0 else min(n, max(1, math.ceil(density * n)))


def coo_message_bytes(count: int, n: int, value_itemsize: int) -> int:
    """Header (32) + int32/int64 indices padded to 8 bytes + values (formats/coo.py layout)."""
    index_size = 4 if n < 2**31 else 8
    return 32 + (count * index_size + 7) // 8 * 8 + count * value_itemsize


def make_gradients(pattern: str, n: int, size: int, step: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Per-rank gradients for one step.

    random: independent normal values; overlap: every rank has the same large entries
    (fully overlapping top-k); disjoint: rank r's large entries live in its own stripe;
    zeros: all-zero input; ties: values from {-1, 0, 1} so magnitudes tie massively.
    """
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    grads = []
    for rank in range(size):
        if pattern == "random":
            g = torch.randn(n, generator=gen, dtype=torch.float64)
        elif pattern == "overlap":
            g = torch.randn(n, generator=gen, dtype=torch.float64) * 0.01
            g[: max(1, n // 20)] += 10.0 + rank
        elif pattern == "disjoint":
            g = torch.randn(n, generator=gen, dtype=torch.float64) * 0.01
            lo, hi = rank * n // size, (rank + 1) * n // size
            g[lo:hi] *= 1000.0
        elif pattern == "zeros":
            g = torch.zeros(n, dtype=torch.float64)
        elif pattern == "ties":
            g = torch.randint(-1, 2, (n,), generator=gen).double()
        else:
            raise ValueError(pattern)
        grads.append(g.to(dtype))
    return grads
