"""``gtopk``: gTop-k (Shi et al., ICDCS'19), the global top-k tree reduction.

Each rank selects its local top-k by magnitude (the unselected rest is its residual).
Then a recursive-halving tree on the largest power of two ``p2 <= P`` (the other
``P - p2`` ranks fold into partners first, see :mod:`._folding`): at the round with
distance d = 2^s, rank r with r % 2d == d sends its k entries (COO) to r - d, which
merge-adds them with its own (its own first) and keeps the top-k of the sum by magnitude
(ties: lower index). After log2(p2) rounds rank 0 holds the global top-k; a binomial
broadcast sends those k entries back down the tree (log2(p2) rounds) and to the folded
ranks (one round).

Residuals (conservation): every entry a merge drops -- a partial sum of several ranks'
selected values -- is added into the residual (``acc``) of the rank that dropped it, at its
index. A rank's own selected values are removed from its residual when it sends or keeps
them; each of them then is either in the output or inside exactly one dropped partial sum,
so sum_r acc_r == out + sum_r residual_r (up to float rounding of the partial sums). Note
that the "put back your own local top-k entries that are not in the global top-k" rule is
not enough here: an index can be dropped in one subtree and still reach the output from
another, and the dropped contributions would be lost.

Every message has exactly min(k, N) entries (a merge of two k-entry vectors has >= k
distinct indices, and the top-k keeps k of them), so receivers know sizes.

Codecs (``index_codec``, ``value_codec``, :mod:`sparsecomm.formats.codec`): every message goes
through the codec and is exchanged with ``exchange_var`` (one size round more per message
where the Comm needs one: :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`).
With a lossy value codec the sender of a tree message keeps ``true - decoded`` in its
residual and the receiver merges the decoded values; rank 0 encodes the result once (its
error kept in its residual) and the broadcast forwards those bytes unchanged, so every rank
decodes the same values. ``index_codec`` alone leaves every result bit-identical.

Cost per call: 2 * log2(p2) rounds, plus 2 when P is not a power of two; 2(P-1) messages
of ``coo_nbytes(k)`` in all (rank 0 sends log2(p2) of them, plus one to its folded partner).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import ops
from ..formats import index_dtype_for
from ..formats.coo import coo_nbytes
from ..traffic import IndexSets, Traffic
from ._folding import fold_layout, largest_power_of_two
from .base import Algorithm, register

__all__ = ["GlobalTopk"]


@register
class GlobalTopk(Algorithm):
    name = "gtopk"
    lossless = False
    uses_coo_codec = True
    fuses_add = True

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n, codec = self.comm, acc.numel(), self.codec
        k = min(k, n)
        if n == 0 or k == 0:
            if grad is not None:
                acc.add_(grad)
            out.zero_()
            self.last_nnz = 0
            return
        itype = index_dtype_for(n)
        with self.timed("select"):
            values, indices = self.select_topk(acc, k, grad, clear=True)
        with self.timed("residual"):
            cur = (indices.to(itype), values.clone())
        size, rank = comm.size, comm.rank
        nbytes = codec.fixed_nbytes(k, n, acc.dtype)

        def recv_payload(source: int) -> torch.Tensor:
            if nbytes is None:
                return comm.exchange_var([], [source])[0]
            buf = torch.empty(nbytes, dtype=torch.uint8, device=acc.device)
            comm.exchange([], [(source, buf)])
            return buf

        def decode(payload: torch.Tensor, source: int) -> tuple[torch.Tensor, torch.Tensor]:
            return codec.decode(payload, n=n, value_dtype=acc.dtype, receiver=rank, sender=source, count=k)

        def send_payload(dest: int, payload: torch.Tensor) -> None:
            if nbytes is None:
                comm.exchange_var([(dest, payload)], [])
            else:
                comm.exchange([(dest, payload)], [])

        def encode(entries):
            """The message of ``entries``; a lossy codec's error stays in this rank's residual."""
            payload, sent = codec.encode(entries[0], entries[1], n, rank)
            if not codec.lossless:
                ops.scatter_add_(acc, entries[0], entries[1] - sent)
            return payload, (entries[0], sent)

        def merge_keep(mine, theirs):
            with self.timed("merge"):
                mi, mv = ops.merge_add(mine[0], mine[1], theirs[0], theirs[1], n)
                kept_v, pos = ops.topk(mv, k)
                drop = torch.ones(mi.numel(), dtype=torch.bool, device=acc.device)
                drop[pos] = False
                ops.scatter_add_(acc, mi[drop], mv[drop])  # what this merge drops stays here
                return mi[pos], kept_v

        fold = fold_layout(size, rank)
        if fold.folded_out:
            send_payload(fold.partner, encode(cur)[0])
            final = decode(recv_payload(fold.partner), fold.partner)
        else:
            if fold.partner is not None:
                cur = merge_keep(cur, decode(recv_payload(fold.partner), fold.partner))
            p2, d = fold.p2, 1
            while d < p2:  # reduce: the tree halves
                if rank % (2 * d) == d:
                    send_payload(rank - d, encode(cur)[0])
                    break
                cur = merge_keep(cur, decode(recv_payload(rank + d), rank + d))
                d *= 2
            # broadcast: binomial tree from rank 0 down the same edges; the root encodes the
            # result once and every rank forwards those bytes (its own rank put in the header's
            # sender field), so all decode the same values
            payload = None
            if rank == 0 and (p2 > 1 or fold.partner is not None):
                payload, cur = encode(cur)
            d = p2 // 2
            while d >= 1:
                if rank % (2 * d) == 0:
                    send_payload(rank + d, codec.readdress(payload, rank))
                elif rank % (2 * d) == d:
                    payload = recv_payload(rank - d)
                    cur = decode(payload, rank - d)
                d //= 2
            final = cur
            if fold.partner is not None:
                send_payload(fold.partner, codec.readdress(payload, rank))
        with self.timed("scatter"):
            # a COO vector (distinct ascending indices): out is written once, zeros between
            ops.scatter_set_(out, final[0], final[1], zero_rest=True)
        self.last_nnz = k

    traffic_model = "exact"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """The fold, the reduce tree, the broadcast down it and the unfold, every message of
        min(k, N) entries (the plain codec)."""
        t = Traffic(P)
        m = coo_nbytes(min(k, N), N, dtype)
        p2 = largest_power_of_two(P)
        extra = P - p2
        if extra:
            t.round(range(p2, P), range(extra), [m] * extra)
        d = 1
        while d < p2:
            snd = [r for r in range(p2) if r % (2 * d) == d]
            t.round(snd, [r - d for r in snd], [m] * len(snd))
            d *= 2
        d = p2 // 2
        while d >= 1:
            snd = [r for r in range(p2) if r % (2 * d) == 0]
            t.round(snd, [r + d for r in snd], [m] * len(snd))
            d //= 2
        if extra:
            t.round(range(extra), range(p2, P), [m] * extra)
        return t
