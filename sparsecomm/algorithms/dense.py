"""``dense``: the baseline every paper measures against -- a plain dense allreduce.

Uses the backend's own allreduce (what DDP does by default). Everything is let through,
so the residual is always zero and density is ignored.
"""

from __future__ import annotations

import torch

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
