"""``dense``: the baseline every paper measures against -- a plain dense allreduce.

Uses the backend's own allreduce (what DDP does by default). Everything is let through,
so the residual is always zero and density is ignored.
"""

from __future__ import annotations

import numpy as np
import torch

from ..traffic import IndexSets, Traffic
from .base import Algorithm, register

__all__ = ["DenseAllreduce"]


@register
class DenseAllreduce(Algorithm):
    name = "dense"
    lossless = True
    propagates_nonfinite = True  # NaN and Inf are summed like the backend's allreduce sums them

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        out.copy_(acc)
        self.comm.allreduce_dense(out)
        acc.zero_()
        self.last_nnz = acc.numel()

    traffic_model = "exact"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                **options) -> Traffic:
        """The ring reduce-scatter + all-gather the simulated Comm runs (chunks of
        torch.tensor_split)."""
        t = Traffic(P)
        isz = dtype.itemsize
        chunk = np.array([(N // P + (1 if j < N % P else 0)) * isz for j in range(P)])
        ranks = np.arange(P)
        for step in range(P - 1):   # reduce-scatter: rank r sends chunk (r - step) mod P
            t.round(ranks, (ranks + 1) % P, chunk[(ranks - step) % P])
        for step in range(P - 1):   # all-gather: rank r sends chunk (r + 1 - step) mod P
            t.round(ranks, (ranks + 1) % P, chunk[(ranks + 1 - step) % P])
        return t
