"""``topka``: TopkA, the all-gather baseline of the SparDL paper (section 2, "TopkA").

Each rank selects its local top-k by magnitude, all ranks all-gather the P COO vectors with
the shared Bruck all-gather (ceil(log2 P) rounds, (P-1) messages of exactly k entries sent
per rank, so no size header is needed), and every rank merge-adds the P vectors in rank
order, which makes the result bit-identical everywhere. Lossless: the output is exactly
the sum of the locally selected vectors; what a rank did not select stays in its residual.

Codecs (``index_codec``, ``value_codec`` and their parameters, :mod:`sparsecomm.formats.codec`):
messages become variable-size and are all-gathered with ``bruck_allgather_var`` (their sizes
travel with them, or in rounds of their own where the Comm needs that:
:meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`). ``index_codec="delta_binary"`` leaves
every result bit-identical. With ``value_codec="skcompress"`` each rank sums the values its
own message decodes to (the encoder returns them) and keeps ``selected - decoded`` in its
residual, so conservation and rank-identical results hold. A rank never decodes its own
message: what the encoder returns is what the others decode, bit for bit.

Cost per rank: ceil(log2 P) rounds, (P-1) * (32 + k*(c + s)) bytes sent (c index bytes,
s value bytes, 32 the header); with a codec and a Comm whose sizes take a round,
ceil(log2 P) more rounds for the sizes.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import ops
from ..comm.collectives import bruck_allgather, bruck_allgather_var
from ..formats.coo import coo_nbytes
from ..formats.header import index_dtype_for
from ..traffic import IndexSets, Traffic
from .base import Algorithm, register

__all__ = ["TopkAllgather"]


@register
class TopkAllgather(Algorithm):
    name = "topka"
    lossless = True
    uses_coo_codec = True
    fuses_add = True

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n, codec = self.comm, acc.numel(), self.codec
        with self.timed("select"):
            # lossless: the selection leaves acc at once (what was not selected is the residual)
            values, indices = self.select_topk(acc, k, grad, clear=codec.lossless)
            message, sent = codec.encode(indices, values, n, comm.rank)
        with self.timed("residual"):
            if not codec.lossless:
                acc.index_copy_(0, indices, values - sent)  # and what the codec did not carry
        nbytes = codec.fixed_nbytes(indices.numel(), n, acc.dtype)
        if nbytes is not None:
            blocks = bruck_allgather(comm, message, [nbytes] * comm.size)
        else:
            blocks = bruck_allgather_var(comm, message)
        with self.timed("merge"):
            count = indices.numel()
            own = (indices.to(index_dtype_for(n)), sent)
            decoded = [own if source == comm.rank else
                       codec.decode(block, n=n, value_dtype=acc.dtype, receiver=comm.rank, sender=source, count=count)
                       for source, block in enumerate(blocks)]
            if len(decoded) == 1:  # one rank: its own vector is the sum (no copy)
                merged_indices, merged_values = decoded[0]
            else:
                merged_indices, merged_values = ops.merge_add_many([d[0] for d in decoded],
                                                                   [d[1] for d in decoded])
        with self.timed("scatter"):
            # merged indices are distinct and ascending: out is written once, zeros between
            ops.scatter_set_(out, merged_indices, merged_values, zero_rest=True)
        self.last_nnz = merged_indices.numel()

    traffic_model = "exact"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """The Bruck all-gather of P messages of min(k, N) entries (the plain codec)."""
        t = Traffic(P)
        t.bruck_allgather(range(P), [coo_nbytes(min(k, N), N, dtype)] * P)
        return t
