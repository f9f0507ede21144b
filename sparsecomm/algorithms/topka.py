"""``topka``: TopkA, the all-gather baseline of the SparDL paper (section 2, "TopkA").

Each rank selects its local top-k by magnitude, all ranks all-gather the P COO vectors with
the shared Bruck all-gather (ceil(log2 P) rounds, (P-1) messages of exactly k entries sent
per rank, so no size header is needed), and every rank merge-adds the P vectors in rank
order, which makes the result bit-identical everywhere. Lossless: the output is exactly
the sum of the locally selected vectors; what a rank did not select stays in its residual.

Cost per rank: ceil(log2 P) rounds, (P-1) * (32 + k*(c + s)) bytes sent (c index bytes,
s value bytes, 32 the header).
"""

from __future__ import annotations

import torch

from .. import ops
from ..comm.collectives import bruck_allgather
from ..formats import coo_nbytes, decode_coo, encode_coo
from .base import Algorithm, register

__all__ = ["TopkAllgather"]


@register
class TopkAllgather(Algorithm):
    name = "topka"
    lossless = True

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        comm, n = self.comm, acc.numel()
        with self.timed("select"):
            values, indices = ops.topk(acc, k)
            acc.index_fill_(0, indices, 0)  # what was not selected stays as the residual
            message = encode_coo(indices, values, n, comm.rank)
        nbytes = coo_nbytes(k, n, acc.dtype)
        blocks = bruck_allgather(comm, message, [nbytes] * comm.size)
        with self.timed("merge"):
            decoded = [decode_coo(block, n=n, value_dtype=acc.dtype, receiver=comm.rank, sender=source, count=k)
                       for source, block in enumerate(blocks)]
            merged_indices, merged_values = ops.merge_add_many([d[0] for d in decoded], [d[1] for d in decoded])
            out.zero_()
            ops.scatter_add_(out, merged_indices, merged_values)
        self.last_nnz = merged_indices.numel()
