"""``skcompress``: SKCompress ("SKCompress: compressing sparse and nonuniform gradient",
sections 3-6) as an allreduce: local top-k, then every message in the SKCompress format --
delta-binary keys with adaptive prefix (section 5) and values as sign-split quantile buckets
in a grouped MinMaxSketch with Huffman-coded cells (section 4) -- through the codec of
:mod:`sparsecomm.formats.codec`.

Topologies (``topology``):

* ``"allgather"`` (default): the Bruck all-gather of the P encoded messages (sizes first,
  ``bruck_allgather_var``); every rank decodes all of them and merge-adds them in rank order,
  so the result is bit-identical everywhere. This is :mod:`.topka`'s procedure with both
  codecs on (the class reuses it).
* ``"ps"``: the paper's parameter-server setting (section 3, Figure 2) with rank 0 as the
  server: every other rank sends its encoded message to rank 0 (one round), which decodes
  them, sums them in rank order, encodes the sum (the aggregated message is compressed too)
  and sends it to every rank (one round); all ranks, rank 0 included, decode that message.

Error feedback: a rank keeps ``selected - decoded`` of its own message in its residual, and
rank 0 also keeps ``sum - decoded`` of the aggregated message in its residual, so
sum_r (g_r + e_r) == out + sum_r e'_r holds (up to float rounding) and no mass is lost to
the lossy codec.

Options: ``q`` (buckets in all, q/2 per sign; default 256, one byte per bucket index),
``s`` (MinMaxSketch rows, default 2), ``t`` (columns per key of each group's sketch, default
0.2 = the paper's d/5 columns), ``r`` (groups per sign, default 8: a decoded bucket is at most
q/(2r) - 1 = 15 buckets closer to zero than the true one), ``m`` (``"auto"`` or 2, 4, 8, 16)
and ``prefix`` (``"auto"``, ``"fixed"``, ``"huffman"``) of the key encoding, ``topology``.

Cost per rank (allgather): ceil(log2 P) rounds, each doubled by a size round where the Comm
needs one (:meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`); (P-1) encoded messages sent.
ps: 2 rounds (plus their size rounds there); rank 0 receives and sends P-1 messages.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from .. import ops
from ..formats.header import index_dtype_for
from ..options import Option
from ..traffic import IndexSets, Traffic, model_sets
from .base import register
from .topka import TopkAllgather

__all__ = ["SKCompress"]

_TOPOLOGIES = ("allgather", "ps")


@register
class SKCompress(TopkAllgather):
    name = "skcompress"
    lossless = False
    option_specs = {"topology": Option("allgather", str, choices=_TOPOLOGIES)}
    # the SKCompress format: both codecs always on
    fixed_codec_options = {"index_codec": "delta_binary", "value_codec": "skcompress"}

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        if self.options["topology"] == "allgather":
            super().reduce(acc, k, out)
            return
        comm, n, codec, rank = self.comm, acc.numel(), self.codec, self.comm.rank
        with self.timed("select"):
            values, indices = ops.topk(acc, k)
            message, sent = codec.encode(indices, values, n, rank)
            acc.index_copy_(0, indices, values - sent)
        count = indices.numel()
        others = [q for q in range(comm.size) if q != 0]
        if rank != 0:
            comm.exchange_var([(0, message)], [])
            result = comm.exchange_var([], [0])[0]
            with self.timed("merge"):
                idx, val = codec.decode(result, n=n, value_dtype=acc.dtype, receiver=rank, sender=0)
        else:
            received = comm.exchange_var([], others)
            with self.timed("merge"):
                parts = [codec.decode(m, n=n, value_dtype=acc.dtype, receiver=0, sender=q, count=count)
                         for q, m in zip(others, received)]
                mine = (indices.to(index_dtype_for(n)), sent)   # as the others would decode it
                sum_idx, sum_val = ops.merge_add_many([mine[0]] + [p[0] for p in parts],
                                                      [mine[1]] + [p[1] for p in parts])
            with self.timed("select"):
                result, idx_sent = codec.encode(sum_idx, sum_val, n, 0)
                ops.scatter_add_(acc, sum_idx, sum_val - idx_sent)  # the aggregate's error stays here
            comm.exchange_var([(q, result) for q in others], [])
            idx, val = sum_idx, idx_sent
        with self.timed("merge"):
            ops.scatter_set_(out, idx, val, zero_rest=True)  # a COO vector: distinct indices
        self.last_nnz = idx.numel()

    traffic_model = "estimated"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                topology: str = "allgather", **options: Any) -> Traffic:
        """Estimate: every rank's message (and the server's sum) taken to be one real message of
        the default codec (:func:`_coded_nbytes`); the sizes' rounds as ``exchange_var`` and
        ``bruck_allgather_var`` send them."""
        t = Traffic(P)
        t.exact = False
        if P == 1:
            return t
        m = _coded_nbytes(N, min(k, N), dtype)
        if topology == "ps":
            t.var_round(range(1, P), [0] * (P - 1), [m] * (P - 1))
            t.var_round([0] * (P - 1), range(1, P), [m] * (P - 1))
        else:
            t.bruck_allgather(range(P), [m] * P, var=True)
        return t


@lru_cache(maxsize=None)
def _coded_nbytes(N: int, k: int, dtype: torch.dtype) -> int:
    """One rank's real SKCompress message (the default options' codec) for k standard-normal
    values at indices drawn by the gradient model: every rank's message is taken to be this size."""
    codec = SKCompress(None).codec
    idx = torch.from_numpy(model_sets(1, N, k)[0])
    vals = torch.randn(idx.numel(), generator=torch.Generator().manual_seed(1)).to(dtype)
    return int(codec.encode(idx, vals, N, 0)[0].numel())
