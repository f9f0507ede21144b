"""``densestream``: DenseStreamAllreduce ("DenseStream: A Novel Data Representation for
Gradient Sparsification", section III-B, Algorithm 2).

Each rank selects its local top-k by magnitude (Algorithm 2 lines 5-8: what it does not
select stays in its residual ``acc``) and encodes it as a DenseStream (line 9; dense
blocks, :mod:`sparsecomm.formats.densestream`). Then three phases (lines 14-19):

1. **Balanced split** (section III-B-1). Each rank proposes the boundaries of ``p2``
   partitions of ``[0, N)`` holding equal counts of its own selection: with its ``m``
   selected indices sorted, boundary ``j`` (1 <= j < p2) is the index at position
   ``floor(j m / p2)``. The ranks average the proposals: the shared all-gather of small
   headed int64 messages (``comm.collectives.allgather_int64``; each rank's proposals are
   then checked to lie in [0, N] and not decrease), summed in int64 -- integer sums are
   exact, so every rank gets the same sums in any order -- then ``floor(sum / P)`` on
   every rank. Averages of non-decreasing sequences are non-decreasing, so the boundaries
   ``0 = B_0 <= B_1 <= ... <= B_p2 = N`` are valid (a partition may be empty) and
   identical everywhere. All P ranks propose (folded ones too); ``p2`` is the core size
   below.
2. **Scatter-reduce by recursive halving** (section III-B-2, Fig. 3). With distance
   ``d = p2/2, p2/4, ..., 1``: rank r and r XOR d split the partitions they hold in two
   halves; each keeps the half that holds its own partition (rank r ends with partition
   r), sends the other as a DenseStream message sliced out of its current stream
   (``ops.densestream_slice``), and adds what it receives to its kept half
   (``ops.densestream_add``: blocks merged, overlaps summed, re-split by the zero-run
   rule). The lower rank's stream is the left operand of every addition, so each value
   is summed along one fixed tree: fold partners first (r + (r + p2)), then the
   butterfly over distances p2/2 ... 1, lower rank first.
3. **Allgatherv by recursive doubling**: with distance ``d = 1, 2, ..., p2/2`` rank r
   sends everything it holds (the reduced partitions of its aligned group of d ranks,
   one DenseStream over their joint range) to r XOR d and receives the peer's group.
   Sizes are not known to the receiver: ``Comm.exchange_var`` (a size round only where the
   Comm needs one: :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`). Every rank then writes the same p2 reduced partitions into ``out``,
   so the result is bit-identical on every rank.

Any P: the ``P - p2`` ranks beyond the largest power of two fold into partners with
:mod:`._folding` (MPICH style): each sends its DenseStream to ``rank - p2`` before the
scatter-reduce and receives the whole result back after the all-gather (2 rounds more).

Lossless: ``out`` is the exact element-wise sum of the ranks' selections along the tree
above (values sent are the selected values; blocks only add zeros), and the residual is
what each rank did not select, so sum_r acc_r == out + sum_r residual_r. No state is
kept between calls (the boundaries are recomputed each call from the current selection).

Cost per rank (section III-B, eqs. 4-6, alpha-beta with k elements per rank): rounds
``ceil(log2 P)`` (the boundary all-gather: P - 1 blocks of 32 + 8 (p2 - 1) bytes) + ``2 log2 p2`` data rounds, + 2 when P is
not a power of two (each data round doubled by a size round where the Comm needs one).
Elements sent: scatter-reduce between (P-1)/P k (fully overlapping selections) and
(P-1) k (disjoint ones), within eq. 4's log2(P)/2 P k; all-gatherv between (P-1)/P k and
(P-1) k (eq. 5). Each element costs K bytes plus, per block, ``2 width`` bytes and at most
T zeros (formats/densestream.py); :attr:`DenseStreamAllreduce.last_phases` reports per
phase the messages, bytes, blocks, values and non-zero elements this rank sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import ops
from ..comm.collectives import allgather_int64
from ..errors import WireFormatError
from ..formats.densestream import DenseBlocks, decode_densestream, densestream_nbytes, encode_densestream
from ..traffic import IndexSets, Traffic, union_sorted
from ._folding import fold_layout, largest_power_of_two
from .base import Algorithm, register

__all__ = ["DenseStreamAllreduce", "propose_boundaries", "check_proposals", "average_boundaries"]


def propose_boundaries(sorted_indices: torch.Tensor, parts: int) -> torch.Tensor:
    """A rank's ``parts - 1`` interior boundaries: the index at position floor(j m / parts)
    of its m sorted selected indices (j = 1 .. parts-1); int64. With m == 0, zeros."""
    m = sorted_indices.numel()
    if m == 0:
        return torch.zeros(parts - 1, dtype=torch.int64, device="cpu")  # host: all-gathered control data
    pos = torch.tensor([j * m // parts for j in range(1, parts)], dtype=torch.int64, device=sorted_indices.device)
    return sorted_indices[pos].to(torch.int64).cpu()  # parts - 1 numbers to the host, not the selection


def check_proposals(table: torch.Tensor, n: int, receiver: int) -> None:
    """Every rank's proposals (row q of the all-gathered int64 table, from rank q) lie in
    [0, N] and do not decrease; :class:`WireFormatError` naming the rank otherwise (a peer's
    numbers, so the same check as any message field)."""
    bad = (table < 0) | (table > n)
    bad[:, 1:] |= table[:, 1:] < table[:, :-1]
    if bool(bad.any()):
        q, j = (int(x) for x in bad.nonzero()[0])
        raise WireFormatError(f"rank {receiver} received from rank {q} a boundary proposal whose boundary [{j}] = "
                              f"{int(table[q, j])} is outside [0, N = {n}] or below the one before")


def average_boundaries(summed: torch.Tensor, size: int, n: int) -> list[int]:
    """``[0, floor(sum_1 / P), ..., floor(sum_{p2-1} / P), N]`` from the int64 sums of the P
    ranks' proposals: exact integer arithmetic, the same on every rank."""
    return [0] + [int(s) // size for s in summed.tolist()] + [n]


def _halves(rank: int, d: int, first: int, last: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(kept, given) halves of the partitions [first, last) that ``rank`` holds at the
    scatter-reduce step of distance ``d``: it keeps the half holding its own partition."""
    mid = (first + last) // 2
    return ((first, mid), (mid, last)) if rank & d == 0 else ((mid, last), (first, mid))


def _runs(arr: np.ndarray) -> int:
    """Runs of consecutive indices in a sorted array."""
    return 0 if len(arr) == 0 else 1 + int(np.count_nonzero(np.diff(arr) > 1))


def _cat(parts: list[DenseBlocks]) -> DenseBlocks:
    """Adjacent reduced ranges in ascending order, as one DenseStream over their union."""
    if len(parts) == 1:
        return parts[0]
    return DenseBlocks(parts[0].n, parts[0].lo, parts[-1].hi, torch.cat([p.starts for p in parts]),
                       torch.cat([p.lengths for p in parts]), torch.cat([p.values for p in parts]))


@register
class DenseStreamAllreduce(Algorithm):
    name = "densestream"
    lossless = True

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        #: per phase of the last call: what this rank sent (see the module doc)
        self.last_phases: dict[str, dict[str, int]] = {}
        #: the averaged partition boundaries of the last call
        self.last_boundaries: list[int] = []

    # -- messages ----------------------------------------------------------------------
    def _note(self, phase: str, d: DenseBlocks, nbytes: int) -> None:
        p = self.last_phases.setdefault(phase, {"messages": 0, "bytes": 0, "blocks": 0, "values": 0, "nonzeros": 0})
        p["messages"] += 1
        p["bytes"] += nbytes
        p["blocks"] += d.nblocks
        p["values"] += d.values.numel()
        p["nonzeros"] += int(torch.count_nonzero(d.values))

    def _swap(self, phase: str, peer: int, send: DenseBlocks | None, lo: int | None, hi: int | None,
              receive: bool = True) -> DenseBlocks | None:
        """One variable-size round with ``peer``: send ``send`` (if any), receive a
        DenseStream over ``[lo, hi)`` (if ``receive``), validated in full."""
        comm, rank = self.comm, self.comm.rank
        sends = []
        if send is not None:
            message = encode_densestream(send, rank)
            self._note(phase, send, message.numel())
            sends.append((peer, message))
        got = comm.exchange_var(sends, [peer] if receive else [])
        if not receive:
            return None
        return decode_densestream(got[0], n=self._n, value_dtype=self._dtype,
                                  receiver=rank, sender=peer, lo=lo, hi=hi)

    # -- the algorithm -----------------------------------------------------------------
    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        comm, n = self.comm, acc.numel()
        size, rank = comm.size, comm.rank
        self.last_phases, self._n, self._dtype = {}, n, acc.dtype
        k = min(k, n)
        with self.timed("select"):
            values, indices = ops.topk(acc, k)
            acc.index_fill_(0, indices, 0)  # what was not selected stays as the residual
            mine = DenseBlocks(n, 0, n, *ops.densestream_encode_coo(indices, values, n))
        if size == 1 or n == 0:
            self._write(out, [mine])
            return
        fold = fold_layout(size, rank)
        p2 = fold.p2
        # 1. balanced split: every rank proposes, the int64 sums are exact and identical
        table = allgather_int64(comm, propose_boundaries(indices, p2).tolist(), n)
        check_proposals(table, n, rank)
        b = average_boundaries(table.sum(0), size, n)
        self.last_boundaries = b
        if fold.folded_out:
            self._swap("fold", fold.partner, mine, None, None, receive=False)
            self._write(out, [self._swap("fold", fold.partner, None, 0, n)])
            return
        if fold.partner is not None:  # the partner's rank is higher: own stream first
            theirs = self._swap("fold", fold.partner, None, 0, n)
            with self.timed("merge"):
                mine = DenseBlocks(n, 0, n, *ops.densestream_add(mine.blocks, theirs.blocks, n))
        # 2. scatter-reduce by recursive halving: rank r ends with partition r
        first, last = 0, p2  # partitions held: [first, last)
        cur = mine
        d = p2 // 2
        while d >= 1:
            peer = rank ^ d
            keep, give = _halves(rank, d, first, last)
            with self.timed("merge"):
                send = DenseBlocks(n, b[give[0]], b[give[1]],
                                   *ops.densestream_slice(cur.blocks, n, b[give[0]], b[give[1]]))
                kept = ops.densestream_slice(cur.blocks, n, b[keep[0]], b[keep[1]])
            theirs = self._swap("scatter_reduce", peer, send, b[keep[0]], b[keep[1]])
            with self.timed("merge"):  # the lower rank's part is the left operand
                pair = (theirs.blocks, kept) if peer < rank else (kept, theirs.blocks)
                cur = DenseBlocks(n, b[keep[0]], b[keep[1]], *ops.densestream_add(pair[0], pair[1], n))
            first, last = keep
            d //= 2
        # 3. allgatherv by recursive doubling: the reduced ranges of aligned groups of d ranks
        held = [cur]
        d = 1
        while d < p2:
            peer = rank ^ d
            base = peer & ~(d - 1)
            theirs = self._swap("allgatherv", peer, _cat(held), b[base], b[base + d])
            held = [theirs] + held if peer < rank else held + [theirs]
            d *= 2
        if fold.partner is not None:
            self._swap("fold", fold.partner, _cat(held), None, None, receive=False)
        self._write(out, held)

    traffic_model = "estimated"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """Estimate from the ranks' index sets: the boundaries as :meth:`reduce` averages them,
        blocks = runs of consecutive indices of each union (the zero-run rule, which joins
        blocks across short gaps, is ignored), values = union count."""
        t = Traffic(P)
        t.exact = False
        if P == 1:
            return t
        p2 = largest_power_of_two(P)
        extra = P - p2
        t.allgather_int64(p2 - 1)
        summed = sum(propose_boundaries(torch.from_numpy(x), p2) for x in sets.sets)
        b = average_boundaries(summed, P, sets.n)

        def msg(arr, lo, hi):
            part = arr[np.searchsorted(arr, lo):np.searchsorted(arr, hi)]
            return densestream_nbytes(sets.count(_runs(part)), sets.count(part), int(N), dtype)

        held = [sets.sets[r] for r in range(P)]
        if extra:
            t.var_round(range(p2, P), range(extra), [msg(held[r], 0, sets.n) for r in range(p2, P)])
            for r in range(extra):
                held[r] = union_sorted(held[r], held[r + p2])
        held_range = [(0, p2)] * p2
        d = p2 // 2
        while d >= 1:
            dst, nb, new = [], [], {}
            for r in range(p2):
                _, give = _halves(r, d, *held_range[r])
                dst.append(r ^ d)
                nb.append(msg(held[r], b[give[0]], b[give[1]]))
            t.var_round(range(p2), dst, nb)
            for r in range(p2):
                keep, _ = _halves(r, d, *held_range[r])
                lo, hi = b[keep[0]], b[keep[1]]
                a, c = held[r], held[r ^ d]
                new[r] = (union_sorted(a[np.searchsorted(a, lo):np.searchsorted(a, hi)],
                                       c[np.searchsorted(c, lo):np.searchsorted(c, hi)]), keep)
            for r in range(p2):
                held[r], held_range[r] = new[r]
            d //= 2
        d = 1
        while d < p2:
            t.var_round(range(p2), [r ^ d for r in range(p2)], [msg(held[r], 0, sets.n) for r in range(p2)])
            joint = {}
            for r in range(p2):   # the aligned group of 2d ranks holds one union: computed once
                g = r & ~(2 * d - 1)
                if g not in joint:
                    joint[g] = union_sorted(held[g], held[g + d])
            held = [joint[r & ~(2 * d - 1)] for r in range(p2)] + held[p2:]
            d *= 2
        if extra:
            t.var_round(range(extra), range(p2, P), [msg(held[r], 0, sets.n) for r in range(extra)])
        return t

    def _write(self, out: torch.Tensor, parts: list[DenseBlocks]) -> None:
        with self.timed("merge"):
            out.zero_()
            for p in parts:
                ops.densestream_add_into_(out, p.blocks)
        self.last_nnz = sum(int(torch.count_nonzero(p.values)) for p in parts)
