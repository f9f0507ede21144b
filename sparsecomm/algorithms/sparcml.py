"""SparCML (Renggli et al., SC'19): sparse streams and three sparse allreduces, plus a chooser.

All four are exact: the output is the dense sum of the locally selected top-k vectors
(unless ``topkdsa`` quantizes, see below), bit-identical on every rank, and the residual is
what a rank did not select. Data travels as sparse streams (wire layout
:mod:`sparsecomm.formats.stream`, summation :mod:`sparsecomm.algorithms._sparse_stream`)
that switch to dense past delta = N * isize / (c + isize).

* ``sparcml_recursive_double`` (SSAR_Recursive_Double, section 4, latency-dominated case):
  in round t ranks 2^t apart exchange everything reduced so far and add it (lower rank's
  stream first, so both partners compute the same bits). Any P: the P - P' ranks beyond
  the largest power of two P' first fold their stream into rank r - P' and get the result
  back at the end (MPICH style; 2 extra rounds). Cost: log2 P' data rounds, between
  k log2 P and k (P - 1) items sent per rank (less once the stream is dense).
* ``sparcml_split_allgather`` (SSAR_Split_AllGather, bandwidth-dominated case): the index
  space is split into P ranges (range j = [j N / P, (j+1) N / P)); each rank sends each
  piece of its selection straight to its owner in one round of non-blocking messages
  (``exchange_var``: sizes vary; a size round only where the Comm needs one, see
  :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`); the owner adds the P pieces in rank
  order; a sparse all-gather (``bruck_allgather_var``: Bruck, sizes with the blocks) gives
  every rank all P reduced ranges, which are disjoint (concatenation).
* ``topkdsa`` (DSAR_Split_AllGather, dynamic case, the TopkDSA baseline of SparDL): the
  same split, then each owner switches its range to dense and a dense all-gather (Bruck,
  sizes known) follows. Option ``quantize_bits=4|8`` (section 5) sends the dense ranges
  QSGD-quantized (``bucket_size`` values per float32 scale, stochastic rounding): the
  output is then the dequantized sum, unbiased but not exact, and the owner adds the
  quantization error of its range to its residual so that conservation still holds.
* ``sparcml`` chooses among the three on every call (same decision on every rank: it
  only uses N, k, P and the previous output's support K, which are identical everywhere):
  with K the support observed on the previous call (min(N, P k) on the first),
  - K >= delta(N) -> dynamic case -> ``topkdsa``;
  - else static: the alpha-beta model of section 4 with options ``alpha`` (latency, s)
    and ``beta`` (s per byte), item = c + isize bytes, L = log2 P' (+2 folding rounds):
      T_rd  = L alpha + beta item sum_{t<L} min(2^t k, K)
      T_sag = (P - 1 + L) alpha + beta item (P-1)/P (k + K)
    -> ``sparcml_recursive_double`` when T_rd <= T_sag (small data: latency dominates),
    else ``sparcml_split_allgather`` (large data with overlap: bandwidth dominates).

Codecs (SKCompress, sections 4-5; options ``index_codec``, ``value_codec``, ``q``, ``s``, ``t``,
``r``, ``m``, ``prefix`` as for topka): a *sparse* stream travels as a COO_CODED message whose N is
its range's length and whose indices are relative to the range (``_sparse_stream.encode_sparse_stream``);
dense streams (the dense switch, topkdsa's dense or QSGD all-gather) are never coded, and the
switch keeps the plain delta(n), so the index codec changes no decision and no bit. A lossy value
codec's error is kept exactly once: in recursive doubling the 2^t ranks holding the same partial
sum all send it, and only the rank with ``rank % distance == 0`` keeps the error (every sender goes
on with its own decoded stream, so partners add identical bits); the result goes back to folded
ranks with the index codec only (exact values); in the split phase each piece's error stays with
its sender and the reduced range's with its owner. ``sparcml`` forwards the options to its
choice; its cost model counts plain bytes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..comm.collectives import bruck_allgather, bruck_allgather_var
from ..formats import CODEC_OPTION_DEFAULTS, CooCodec
from ..formats.header import index_dtype_for
from ..formats.stream import dense_stream_message, stream_delta, stream_nbytes
from . import _qsgd
from ._sparse_stream import SparseStream, decode_sparse_stream, encode_sparse_stream
from ..traffic import IndexSets, Traffic, stream_message_nbytes, union_sorted
from ._folding import fold_layout, largest_power_of_two
from ..options import Option
from .base import Algorithm, get, register

__all__ = ["SparcmlRecursiveDouble", "SparcmlSplitAllgather", "TopkDSA", "Sparcml", "bounds", "choose"]


def bounds(n: int, p: int) -> list[int]:
    """Range boundaries of the split: range j is [bounds[j], bounds[j+1])."""
    return [j * n // p for j in range(p + 1)]


def _send(alg: Algorithm, stream: SparseStream, acc: torch.Tensor, keep_error: bool = True
          ) -> tuple[torch.Tensor, SparseStream]:
    """Encode ``stream`` with the algorithm's codec: ``(message, sent)``. A lossy value codec's
    error ``stream - sent`` goes into the residual ``acc`` at the stream's positions when
    ``keep_error`` (exactly one of the ranks that send the same stream keeps it)."""
    message, sent = encode_sparse_stream(stream, alg.comm.rank, alg.codec)
    if keep_error and sent is not stream:
        acc.index_add_(0, stream.indices.to(torch.int64) + stream.offset, stream.values - sent.values)
    return message, sent


def _select(alg: Algorithm, acc: torch.Tensor, k: int, grad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The local top-k (after ``acc += grad``, fused, when given); what was not selected
    stays in ``acc`` as the residual."""
    with alg.timed("select"):
        values, indices = alg.select_topk(acc, k, grad, clear=True)
    return indices, values


@register
class SparcmlRecursiveDouble(Algorithm):
    name = "sparcml_recursive_double"
    lossless = True
    fuses_add = True
    uses_coo_codec = True  # module docstring, "Codecs"

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        # the result's way back to a folded rank: keys coded, values exact (module docstring)
        self._back_codec = CooCodec({**self.options, "value_codec": "none"})

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n = self.comm, acc.numel()
        size = comm.size
        indices, values = _select(self, acc, k, grad)
        stream = SparseStream.sparse(indices, values, n)
        if size > 1:
            stream = self._allreduce(stream, acc)
        with self.timed("scatter"):
            stream.write_into(out)
        self.last_nnz = stream.count if not stream.is_dense else None

    traffic_model = "set-based"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """Stream sizes from the unions of the groups' index sets; a stream turns dense when the
        two counts' sum passes delta (the SparseStream rule). The plain codec's sizes."""
        t = Traffic(P)
        delta = stream_delta(N, dtype)
        p2 = largest_power_of_two(P)
        extra = P - p2
        # state per rank: (union array or None when dense, count)
        state = []
        for r in range(P):
            c = sets.count(sets.sets[r])
            state.append((None, N) if c > delta else (sets.sets[r], c))

        def add(a, b):
            if a[0] is None or b[0] is None or a[1] + b[1] > delta:
                return (None, N)
            u = union_sorted(a[0], b[0])
            return (u, sets.count(u))

        def nbytes(st):
            return stream_nbytes(N, 0 if st[0] is None else st[1], dtype, st[0] is None)

        if extra:
            t.var_round(range(p2, P), range(extra), [nbytes(state[r]) for r in range(p2, P)])
            for r in range(extra):
                state[r] = add(state[r], state[r + p2])
        d = 1
        while d < p2:
            t.var_round(range(p2), [r ^ d for r in range(p2)], [nbytes(state[r]) for r in range(p2)])
            new = {}
            for r in range(p2):
                lo = min(r, r ^ d)
                if lo not in new:
                    new[lo] = add(state[lo], state[lo ^ d])
            state[:p2] = [new[min(r, r ^ d)] for r in range(p2)]
            d *= 2
        if extra:
            t.var_round(range(extra), range(p2, P), [nbytes(state[r]) for r in range(extra)])
        return t

    def _allreduce(self, stream: SparseStream, acc: torch.Tensor) -> SparseStream:
        comm, rank, size = self.comm, self.comm.rank, self.comm.size
        n, dtype = acc.numel(), acc.dtype
        fold = fold_layout(size, rank)  # MPICH-style folding (shared helper, _folding.py)
        p2, partner = fold.p2, fold.partner

        def recv_from(peer: int, message: torch.Tensor | None, codec: CooCodec) -> SparseStream:
            got = comm.exchange_var([(peer, message)] if message is not None else [], [peer])[0]
            return decode_sparse_stream(got, n=n, offset=0, value_dtype=dtype, receiver=rank, sender=peer,
                                        codec=codec)

        if fold.folded_out:  # folded: hand the stream to rank - P', get the result back at the end
            comm.exchange_var([(partner, _send(self, stream, acc)[0])], [])
            return recv_from(partner, None, self._back_codec)
        if partner is not None:
            other = recv_from(partner, None, self.codec)
            with self.timed("merge"):
                stream = stream.add(other)
        distance = 1
        while distance < p2:
            peer = rank ^ distance
            # the 'distance' ranks rank & ~(distance-1) .. hold this same stream and each send it
            # (to different peers): only the first keeps a lossy codec's error, so it counts once
            message, stream = _send(self, stream, acc, keep_error=rank % distance == 0)
            other = recv_from(peer, message, self.codec)
            with self.timed("merge"):
                if peer < rank:   # lower rank's stream first: both partners compute the same bits
                    stream = _owned(other).add(stream)
                else:
                    stream = _owned(stream).add(other)
            distance *= 2
        if partner is not None:
            comm.exchange_var([(partner, encode_sparse_stream(stream, rank, self._back_codec)[0])], [])
        return stream


def _owned(s: SparseStream) -> SparseStream:
    """A stream whose dense buffer may be written in place (received views are copied)."""
    if s.is_dense:
        return SparseStream(s.n, s.offset, s.values.clone(), None)
    return s


def _split_phase(alg: Algorithm, indices: torch.Tensor, values: torch.Tensor, acc: torch.Tensor,
                 into: torch.Tensor | None = None) -> SparseStream:
    """Send every range of the selection to its owner (one round), reduce the own range in
    rank order (0 + x_0 + x_1 + ... element-wise). With ``into`` (a zeroed dense buffer of
    the own range) the reduction is dense, in place; otherwise a stream that switches to
    dense past its delta. Pieces go through ``alg.codec``; a lossy codec's error of each
    piece stays in the sender's residual ``acc``."""
    n, dtype = acc.numel(), acc.dtype
    comm, rank, size = alg.comm, alg.comm.rank, alg.comm.size
    b = bounds(n, size)
    cuts = torch.searchsorted(indices, torch.tensor(b, dtype=indices.dtype, device=indices.device)).tolist()

    def piece(j: int) -> SparseStream:
        return SparseStream.sparse(indices[cuts[j]:cuts[j + 1]] - b[j], values[cuts[j]:cuts[j + 1]],
                                   b[j + 1] - b[j], b[j])

    peers = [j for j in range(size) if j != rank]
    with alg.timed("select"):
        sends = [(j, _send(alg, piece(j), acc)[0]) for j in peers]
    received = comm.exchange_var(sends, peers) if peers else []
    by_rank = dict(zip(peers, received))
    lo, hi = b[rank], b[rank + 1]
    with alg.timed("merge"):
        acc_stream = SparseStream(hi - lo, lo, into, None) if into is not None else None
        for j in range(size):
            s = piece(j) if j == rank else decode_sparse_stream(by_rank[j], n=hi - lo, offset=lo, value_dtype=dtype,
                                                                receiver=rank, sender=j, codec=alg.codec)
            # received buffers are ours to modify in place
            acc_stream = s if acc_stream is None else acc_stream.add(s)
    return acc_stream


def _split_phase_traffic(t: Traffic, P: int, N: int, sets: IndexSets, dtype: torch.dtype):
    """:func:`_split_phase`'s round: every rank's piece of range j to its owner j. Returns the
    ranges' bounds, every rank's cuts of its set at them and the piece counts [rank, owner]."""
    b = bounds(N, P)
    scale = sets.scale
    cuts = [np.searchsorted(x, np.asarray(b) / scale if scale != 1 else b) for x in sets.sets]
    pieces = np.array([[c[j + 1] - c[j] for j in range(P)] for c in cuts], dtype=np.int64)
    src, dst, nb = [], [], []
    for r in range(P):
        for j in range(P):
            if j != r:
                src.append(r)
                dst.append(j)
                nb.append(stream_message_nbytes(b[j + 1] - b[j], sets.count(pieces[r, j]), dtype))
    t.var_round(src, dst, nb)
    return b, cuts, pieces


def _owner_result(P: int, sets: IndexSets, dtype: torch.dtype, b, cuts, pieces, j: int) -> tuple[bool, int]:
    """(dense, count) of owner j's reduced stream: pieces added in rank order."""
    n_j = b[j + 1] - b[j]
    delta = stream_delta(n_j, dtype)
    parts = [sets.sets[r][cuts[r][j]:cuts[r][j + 1]] for r in range(P)]
    c = sets.count(parts[0])
    if c > delta:
        return True, n_j
    cat = np.concatenate(parts)
    owner = np.repeat(np.arange(P), [len(p) for p in parts])
    order = np.argsort(cat, kind="stable")   # stable: the first of equal indices has the lowest rank
    srt = cat[order]
    first = order[np.concatenate([[True], srt[1:] != srt[:-1]])] if len(srt) else order
    new_at = np.bincount(owner[first], minlength=P)
    running = np.cumsum(new_at)
    for i in range(1, P):
        if c + sets.count(pieces[i, j]) > delta:
            return True, n_j
        c = sets.count(running[i])
    return False, c


@register
class SparcmlSplitAllgather(Algorithm):
    name = "sparcml_split_allgather"
    lossless = True
    fuses_add = True
    uses_coo_codec = True  # module docstring, "Codecs"

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n, rank, size = self.comm, acc.numel(), self.comm.rank, self.comm.size
        indices, values = _select(self, acc, k, grad)
        mine = _split_phase(self, indices, values, acc)
        if size > 1:  # the owner alone holds its reduced range: it keeps a lossy codec's error of it
            message, mine = _send(self, mine, acc)
            blocks = bruck_allgather_var(comm, message)
        else:
            blocks = [None]
        b = bounds(n, size)
        total, dense = 0, False
        with self.timed("scatter"):
            for j in range(size):  # disjoint ranges: each written into its slice of out
                s = mine if j == rank else decode_sparse_stream(blocks[j], n=b[j + 1] - b[j], offset=b[j],
                                                                value_dtype=acc.dtype, receiver=rank, sender=j,
                                                                codec=self.codec)
                s.write_into(out)
                total += s.count
                dense |= s.is_dense
        self.last_nnz = None if dense else total

    traffic_model = "set-based"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """The split round and the variable-size Bruck all-gather of the reduced ranges, their
        sizes from the ranks' index sets (the plain codec's)."""
        t = Traffic(P)
        if P == 1:
            return t
        b, cuts, pieces = _split_phase_traffic(t, P, N, sets, dtype)
        sizes = []
        for j in range(P):
            dense, c = _owner_result(P, sets, dtype, b, cuts, pieces, j)
            sizes.append(stream_nbytes(b[j + 1] - b[j], 0 if dense else c, dtype, dense))
        t.bruck_allgather(range(P), sizes, var=True)
        return t


_MAX_BUCKET = 2**31 - 1


@register
class TopkDSA(Algorithm):
    name = "topkdsa"
    lossless = True  # the instance says False when quantize_bits is set (see module docstring)
    fuses_add = True
    option_specs = {
        "quantize_bits": Option(None, int, choices=_qsgd.QUANTIZE_BITS, doc="an int"),
        # the QSGD header carries bucket_size as an int32 (formats/stream.py)
        "bucket_size": Option(512, int, min=1, max=_MAX_BUCKET,
                              check=lambda bucket, options: not (options["quantize_bits"] == 4 and bucket % 2),
                              what=f"an integer in 1..{_MAX_BUCKET}", doc="even with quantize_bits=4"),
        "seed": Option(0, int, what="an integer"),
    }
    uses_coo_codec = True  # the split phase's sparse pieces only; the ranges go dense

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        # quantized: unbiased, error kept in the residual, not exact
        self.lossless = self.lossless and self.options["quantize_bits"] is None
        self._step = 0

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n, rank, size = self.comm, acc.numel(), self.comm.rank, self.comm.size
        bits, bucket = self.options["quantize_bits"], self.options["bucket_size"]
        indices, values = _select(self, acc, k, grad)
        b = bounds(n, size)
        lo, hi = b[rank], b[rank + 1]
        # the owner reduces its range straight into the dense message it will send
        message, dense = dense_stream_message(hi - lo, lo, acc.dtype, rank, acc.device)
        mine = _split_phase(self, indices, values, acc, into=dense)
        if bits is None:
            block = message
            sizes = [stream_nbytes(b[j + 1] - b[j], 0, acc.dtype, True) for j in range(size)]
        else:
            with self.timed("select"):
                seed = _qsgd.seed_for(self.options["seed"], rank, self._step)
                block = _qsgd.quantize_range(mine.values, lo, bits, bucket, seed, rank)
                own = _qsgd.dequantize_range(block, n=hi - lo, offset=lo, bits=bits, bucket_size=bucket,
                                             dtype=acc.dtype, receiver=rank, sender=rank)
                acc[lo:hi] += mine.values - own  # quantization error stays with the owner: conservation
            sizes = [_qsgd.qsgd_nbytes(b[j + 1] - b[j], bits, bucket) for j in range(size)]
        self._step += 1
        blocks = bruck_allgather(comm, block, sizes)
        with self.timed("scatter"):
            for j in range(size):
                m = b[j + 1] - b[j]
                if bits is None and j == rank:
                    out[lo:hi].copy_(dense)
                elif bits is None:
                    decode_sparse_stream(blocks[j], n=m, offset=b[j], value_dtype=acc.dtype, receiver=rank,
                                         sender=j).write_into(out)
                else:
                    out[b[j]:b[j + 1]].copy_(_qsgd.dequantize_range(
                        blocks[j], n=m, offset=b[j], bits=bits, bucket_size=bucket, dtype=acc.dtype,
                        receiver=rank, sender=j))
        self.last_nnz = None

    traffic_model = "set-based"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """The split round from the ranks' index sets, then the dense all-gather of the ranges
        (without quantization)."""
        t = Traffic(P)
        if P == 1:
            return t
        b, _, _ = _split_phase_traffic(t, P, N, sets, dtype)
        t.bruck_allgather(range(P), [stream_nbytes(b[j + 1] - b[j], 0, dtype, True) for j in range(P)])
        return t

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step} if self.options["quantize_bits"] else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._step = int(state.get("step", 0))

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {"step": state["step"]} if "step" in state else {}  # seeds randomness, not about the tensor


def choose(n: int, k: int, size: int, observed_k: int | None, value_dtype: torch.dtype = torch.float32,
           alpha: float = 50e-6, beta: float = 8e-9) -> str:
    """The ``sparcml`` rule (module docstring): which of the three algorithms to run."""
    if size == 1 or n == 0:
        return "sparcml_recursive_double"
    big_k = min(n, size * k) if observed_k is None else observed_k
    if big_k >= stream_delta(n, value_dtype):
        return "topkdsa"
    isize = value_dtype.itemsize
    item = isize + index_dtype_for(n).itemsize
    p2 = 1 << (size.bit_length() - 1)
    rounds = int(math.log2(p2)) + (2 if p2 != size else 0)
    t_rd = rounds * alpha + beta * item * (sum(min((1 << t) * k, big_k) for t in range(int(math.log2(p2))))
                                           + (2 * k if p2 != size else 0))
    t_sag = (size - 1 + math.ceil(math.log2(size))) * alpha + beta * item * (size - 1) / size * (k + big_k)
    return "sparcml_recursive_double" if t_rd <= t_sag else "sparcml_split_allgather"


@register
class Sparcml(Algorithm):
    name = "sparcml"
    lossless = True
    fuses_add = True
    # finite: inf or NaN would make every cost comparison in choose() the same, whatever P, N, k
    option_specs = {
        "alpha": Option(50e-6, float, min=0, doc="seconds per message, e.g. 50e-6; python -m "
                                                 "sparsecomm.bench collectives fits both on your links"),
        "beta": Option(8e-9, float, min=0, doc="seconds per byte, e.g. 8e-9 for 1 Gbit/s; python -m "
                                               "sparsecomm.bench collectives fits both on your links"),
    }
    uses_coo_codec = True  # passed on to the chosen algorithm

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        self._codec_options = {key: self.options[key] for key in CODEC_OPTION_DEFAULTS}
        self._algs: dict[str, Algorithm] = {}
        self.observed_k: int | None = None
        self.last_choice: str | None = None

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        size = self.comm.size
        choice = choose(acc.numel(), k, size, self.observed_k, acc.dtype, self.options["alpha"],
                        self.options["beta"])
        alg = self._algs.get(choice)
        if alg is None:
            alg = self._algs[choice] = get(choice)(self.comm, **self._codec_options)
        alg.times = self.times  # phases accumulate into this object's timings
        alg.reduce(acc, k, out, grad=grad)
        self.last_choice = choice
        # observed fill-in: the support of the (identical) output
        self.observed_k = alg.last_nnz if alg.last_nnz is not None else int(torch.count_nonzero(out))
        self.last_nnz = self.observed_k

    traffic_model = "set-based"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                observed_k: int | None = None, **options: Any) -> Traffic:
        """The traffic of what :func:`choose` picks for this call (``alpha``, ``beta`` as the
        options; ``observed_k``: the previous call's support, None on the first call)."""
        rule = {key: options[key] for key in ("alpha", "beta") if key in options}
        name = choose(N, k, P, observed_k, dtype, **rule)
        t = get(name).traffic(P, N, k, sets, dtype)
        t.notes.append(f"sparcml chose {name}")
        return t

    def state_dict(self) -> dict[str, Any]:
        return {"observed_k": self.observed_k} if self.observed_k is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.observed_k = state.get("observed_k")
