"""``gssgd``: gs-SGD ("A Distributed SGD Algorithm with Global Sketching for Deep Learning
Training Acceleration", section III-A, Algorithms 1 and 2), global Count-Sketch SGD, with
the two truncations of Sketched-SGD (Ivkin et al., "Communication-efficient Distributed SGD
with Sketching", section 4: each worker sketches only its local top-``p1 k``, and the exact
second round fetches ``p2 k`` candidates).

One call:

1. each rank selects its local top-``p1 k`` of ``acc`` (its gradient plus residual) by
   magnitude and sketches only those entries into a ``rows x columns`` float32 Count-Sketch
   (the ``sketch_*`` ops of :mod:`sparsecomm.ops`; every rank uses the same ``seed``);
   ``p1=None`` sketches all of ``acc`` (the paper's Algorithm 1, line 5). ``columns``, unless
   given, is sized to the candidates' heavy-hitter guarantee (:func:`sketch_columns`): the
   narrowest width at which k equal heavy entries leave, in expectation, at most half the
   spare candidates ``(c - k) / 2`` of the other coordinates with estimates as large as theirs
   (:func:`false_candidates`), so that all k reach the exact round. That width grows like
   k log(N / k): at 5 rows and p2 = 8, 16.7 cells per entry at density 1%, 40.9 at 0.1%.
   A width from k alone (``sketch_size`` cells per entry, the previous default of 10) left
   ~9% of all coordinates with estimates as large as the heavy ones at density 0.1% (5 x 400
   cells for 200 entries: a bucket holds a heavy entry with probability 0.39 per row), more
   than 8k candidates hold, and recovered 36% of 200 planted heavy entries;
2. the sketches are summed without a root (``allreduce="scatter"``, default): a Bruck
   reduce-scatter of P slices of the table and a Bruck all-gather of the summed slices
   (:func:`sparsecomm.comm.collectives.reduce_scatter_allgather_`), 2 ceil(log2 P) rounds,
   about 2 (P-1)/P of the table sent per rank, any P. ``allreduce="tree"`` is the paper's
   recursive halving to rank 0 (Algorithm 1, lines 8-23, Figure 1) run backwards to hand the
   sum down (:func:`~sparsecomm.comm.collectives.halving_allreduce_`): rank 0 then receives
   and sends 2 ceil(log2 P) whole tables in sequence;
3. HEAVYMIX (Algorithm 2) picks about ``c = ceil(p2 k)`` candidate indices from the summed
   sketch (identical on every rank). ``estimate="sliced"`` (default): rank r estimates only
   the coordinates of its slice r of 0..N-1 (P contiguous slices, lengths differing by at most
   one) and proposes the ceil(c / P) best of them; a Bruck all-gather of the proposals
   (headed int32 index blocks, validated) hands every rank the same P ceil(c / P) candidates,
   so the O(N rows) estimate is cut by P for ceil(log2 P) more rounds and (P-1)/P 4c bytes
   (a slice gives at most ceil(c / P): when p2 < P, a slice holding more than p2 k / P of the
   global top-k loses some; ``estimate="full"`` estimates all N on every rank instead).
   ``heavymix="topk"`` (default) proposes the largest |estimates| (ties to the lower index);
   ``heavymix="random"`` the heavy set H = {i : est_i^2 >= ||g||^2 / k} (||g||^2 estimated as
   the median over rows of the row sums of squares) filled up with indices drawn uniformly
   from the rest by a generator seeded by (seed, step, slice), as in the paper (the largest of
   H when H is larger). A NaN in the summed table (only a NaN in some rank's ``acc`` or an
   overflow of the sum makes one) raises the same ValueError on every rank under both rules,
   before the exact round: every rank holds the same table;
4. second round: each rank gathers its exact ``acc`` values at the c candidates and the
   c-vectors are summed the same way; every rank then keeps the top-k of the exact sums
   (when c > k) -- bit-identical everywhere, as the sums are;
5. each rank's residual is ``acc`` with its own values at the k outputs removed: exactly what
   it contributed to the output, so conservation holds up to float rounding.

Options: ``rows`` (1..64), ``sketch_size`` (None: the width of the heavy-hitter guarantee;
else cells per selected entry, > 0), ``columns`` (None: from ``sketch_size``; else a width in
1..2^32 - 1), ``p1`` (None or >= 1), ``p2`` (>= 1),
``allreduce`` ("scatter" or "tree"), ``estimate`` ("sliced" or "full"), ``seed`` (int),
``heavymix`` ("topk" or "random");
defaults in :attr:`GlobalSketchSGD.option_defaults`, chosen from the measurements of energy
captured per byte and of planted heavy hitters recovered in docs/gssgd.md. A sketch at least as large as the dense gradient warns
(once per instance): then dense sends less.

Cost per call (:meth:`GlobalSketchSGD.rank_traffic` gives it exactly, per rank): two all-reduces,
of ``rows x columns`` float32 and of the candidates' values in ``acc``'s dtype, and with
``estimate="sliced"`` the candidates' all-gather; with ``"scatter"`` 5 ceil(log2 P) rounds on
every rank (4 with ``estimate="full"``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .. import ops
from ..comm.base import Comm
from ..comm.collectives import (block_bounds, bruck_allgather, bruck_allgather_traffic, halving_allreduce_,
                                halving_allreduce_traffic, reduce_scatter_allgather_,
                                reduce_scatter_allgather_traffic)
from ..errors import WireFormatError
from ..formats.header import HEADER_NBYTES, Kind, check_header, index_dtype_for, pack_header
from ..traffic import IndexSets, Traffic
from ..options import Option
from .base import Algorithm, register

__all__ = ["GlobalSketchSGD", "sketch_columns", "false_candidates", "MIN_COLUMNS"]

#: the narrowest automatic sketch: one run of 16 coordinates takes 16 consecutive buckets
MIN_COLUMNS = 16


def false_candidates(n: int, k: int, rows: int, columns: int) -> float:
    """Expected number of coordinates, among the ``n - k`` others, whose median estimate
    reaches the size of ``k`` equal heavy entries (the hard case for a sketch): in a row a
    coordinate's bucket holds one of them with probability ``p = 1 - exp(-k / columns)``,
    with either sign, and the median over ``rows`` rows is as large as a heavy entry when at
    least ``rows // 2 + 1`` rows collide with the same sign: ``2 P(Binomial(rows, p/2) >= h)``."""
    p = 1.0 - math.exp(-k / columns)
    h = rows // 2 + 1
    tail = sum(math.comb(rows, j) * (p / 2) ** j * (1 - p / 2) ** (rows - j) for j in range(h, rows + 1))
    return (n - k) * min(1.0, 2.0 * tail)


def sketch_columns(n: int, k: int, rows: int, candidates: int, sketch_size: float | None = None) -> int:
    """The automatic sketch width.

    ``sketch_size`` given: ``ceil(sketch_size k / rows)`` (about ``sketch_size`` cells per
    selected entry). ``None`` (the default): the heavy-hitter guarantee of the candidates --
    the narrowest width (at least :data:`MIN_COLUMNS`, at most ``n``) whose
    :func:`false_candidates` fit half the spare candidates, ``(candidates - k) / 2`` (at
    least ``k / 16``), so that k planted equal heavy entries all reach the exact round. It
    grows like ``k log(n / k)``: ~17 cells per entry at 5 rows, p2 = 8 and density 1%, ~41 at
    0.1% (docs/gssgd.md)."""
    if sketch_size is not None:
        return max(MIN_COLUMNS, math.ceil(sketch_size * k / rows))
    if n <= k:
        return MIN_COLUMNS
    budget = max(candidates - k, k / 8) / 2
    lo, hi = MIN_COLUMNS, max(MIN_COLUMNS, n)
    if false_candidates(n, k, rows, lo) <= budget:
        return lo
    if false_candidates(n, k, rows, hi) > budget:
        return hi
    while hi - lo > 1:  # false_candidates falls as the width grows
        mid = (lo + hi) // 2
        if false_candidates(n, k, rows, mid) <= budget:
            hi = mid
        else:
            lo = mid
    return hi


@register
class GlobalSketchSGD(Algorithm):
    name = "gssgd"
    lossless = False
    option_specs = {
        "rows": Option(5, int, min=1, max=64),
        "sketch_size": Option(None, float, min=0, min_open=True,
                              none_doc="auto: sized to the candidates' heavy-hitter guarantee",
                              label="sketch_size (sketch cells per selected entry)"),
        # the sketch kernels take cols in [1, 2^32 - 1] (sketch.h)
        "columns": Option(None, int, min=1, max=2**32 - 1, none_doc="auto: from sketch_size"),
        "p1": Option(1.0, float, min=1, optional=True, none_doc="sketch all of acc",
                     label="p1 (each rank sketches its local top-p1*k)"),
        "p2": Option(8.0, float, min=1, label="p2 (p2*k candidates in the exact round)"),
        "allreduce": Option("scatter", str, choices=("scatter", "tree")),
        "estimate": Option("sliced", str, choices=("sliced", "full")),
        "seed": Option(0x5EED, int),
        "heavymix": Option("topk", str, choices=("topk", "random")),
    }
    # the Count-Sketch hash family of csrc/include/sparsecomm/sketch.h (runs of 16 coordinates
    # on consecutive buckets): ranks whose builds hash differently would sum unrelated sketches;
    # "hh-width": the default width from the heavy-hitter guarantee (a peer sizing from k alone
    # would send a table of another width)
    wire_revision = "sketch-runs16/hh-width"

    def __init__(self, comm: Comm, **options: Any):
        super().__init__(comm, **options)
        self._step = 0
        self._warned = False

    # -- sizes and traffic -------------------------------------------------------------------

    @staticmethod
    def _shape(n: int, k: int, options: dict[str, Any]) -> tuple[int, int, int, int]:
        """(k, rows, columns, candidates wanted) of one call on a length-n tensor."""
        k = min(k, n)
        rows = options["rows"]
        wanted = min(n, math.ceil(options["p2"] * k))
        cols = options["columns"] or sketch_columns(n, k, rows, wanted, options["sketch_size"])
        return k, rows, cols, wanted

    @staticmethod
    def slice_quotas(n: int, size: int, candidates: int) -> tuple[list[int], list[int]]:
        """``estimate="sliced"``: the P + 1 bounds of the ranks' coordinate slices and how many
        candidates each slice gives, ceil(candidates / P) (at most its length)."""
        bounds = block_bounds(n, size)
        share = -(-candidates // size)
        return bounds, [min(bounds[q + 1] - bounds[q], share) for q in range(size)]

    @classmethod
    def rank_traffic(cls, P: int, N: int, k: int, value_size: int = 4, rank: int | None = None,
                     **options: Any) -> tuple[int, int]:
        """(bytes sent, rounds) of one call at P ranks, length N and k selected entries, from
        the message schedule (the simulated Comm counts exactly this; tests/test_gssgd.py checks it).

        ``value_size``: bytes per value of ``acc`` (4 for float32); ``rank``: that rank's
        figures, or None for the largest over the ranks (the slowest rank's bytes and
        rounds). Headers (32 bytes a message) included. With ``allreduce="scatter"``,
        ``estimate="sliced"``, S = rows x columns, c = P ceil(p2 k / P) candidates and
        i = 4 (int32 indices; 8 from N = 2^31):

            bytes ~ 2 (P-1)/P (4 S + value_size c) + (P-1)/P i c + 32 (2 ceil(log2 P) + 3 (P-1)),
            rounds = 5 ceil(log2 P);

        ``estimate="full"`` drops the index all-gather (c = ceil(p2 k); 4 ceil(log2 P) rounds);
        with ``"tree"`` rank 0 sends one whole message per tree edge it is on, up and down.
        The default sketch grows like k log(N / k) (:func:`sketch_columns`); p1 changes only the
        compute (what is sketched).
        """
        options = cls.resolve_options(options)
        if N == 0 or k == 0 or P == 1:
            return 0, 0
        k, rows, cols, wanted = cls._shape(N, k, options)
        step = reduce_scatter_allgather_traffic if options["allreduce"] == "scatter" else halving_allreduce_traffic
        index_blocks = None
        cand = wanted
        if options["estimate"] == "sliced":
            _, quotas = cls.slice_quotas(N, P, wanted)
            isize = index_dtype_for(N).itemsize
            index_blocks = [HEADER_NBYTES + q * isize for q in quotas]
            cand = sum(quotas)
        best = (0, 0)
        for r in range(P) if rank is None else [rank]:
            sketch_bytes, sketch_rounds = step(P, r, rows * cols, 4)
            value_bytes, value_rounds = step(P, r, cand, value_size)
            index_bytes, index_rounds = bruck_allgather_traffic(r, index_blocks) if index_blocks else (0, 0)
            best = max(best, (sketch_bytes + value_bytes + index_bytes, sketch_rounds + value_rounds + index_rounds))
        return best

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._step = int(state.get("step", 0))

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {"step": state["step"]} if "step" in state else {}  # seeds randomness, not about the tensor

    # -- one call ----------------------------------------------------------------------------

    def _allreduce_(self, tensor: torch.Tensor, n: int) -> None:
        if self.options["allreduce"] == "scatter":
            reduce_scatter_allgather_(self.comm, tensor, n)
        else:
            halving_allreduce_(self.comm, tensor, n)

    def heavymix(self, table: torch.Tensor, n: int, k: int, count: int | None = None,
                 lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Algorithm 2 on the summed sketch: ``count`` (default k) candidate indices among the
        coordinates ``lo .. hi - 1`` (default all n), int64 ascending. The heavy threshold
        ||g||^2 / k uses k, the number of outputs."""
        count = k if count is None else count
        hi = n if hi is None else hi
        seed = self.options["seed"]
        if bool(table.isnan().any()):
            # a NaN cell (a NaN in some rank's acc, or an overflow of the sum) would rank anywhere:
            # comparisons with NaN are false, so heavymix="random" used to pass it (kept in a
            # residual or drawn at random), and under "topk" a median over rows can hide it.
            # Every rank holds the same summed table, so every rank raises here, before the
            # exact round.
            row, column = (int(v) for v in table.isnan().nonzero()[0])
            raise ValueError(f"gssgd: the summed sketch holds NaN (row {row}, column {column}): a NaN in some "
                             "rank's acc, or a sum that overflowed; heavymix cannot rank it. Check the gradients "
                             "(the reducer's nonfinite='raise' names the ranks)")
        if lo == 0 and hi == n:
            est = ops.sketch_estimate(table, n, seed)
        else:
            est = ops.sketch_estimate_at(table, torch.arange(lo, hi, dtype=torch.int64, device=table.device), seed)
        if self.options["heavymix"] == "topk":
            return ops.topk(est, count)[1] + lo
        threshold = ops.sketch_l2sq(table) / k
        heavy = (est.double().pow(2) >= threshold)
        h = int(heavy.sum())
        if h >= count:
            masked = torch.where(heavy, est, torch.zeros_like(est))
            return ops.topk(masked, count)[1] + lo
        rest = (~heavy).nonzero().squeeze(1)
        # drawn on the host with a CPU generator, so every device picks the same indices
        gen = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + self._step * 65_537 + lo)
                                                        & 0x7FFFFFFFFFFFFFFF)
        perm = torch.randperm(rest.numel(), generator=gen, device="cpu")[:count - h]
        pick = rest[perm.to(rest.device)]
        return torch.cat([heavy.nonzero().squeeze(1), pick]).sort().values + lo

    def _sliced_candidates(self, table: torch.Tensor, n: int, k: int, wanted: int) -> torch.Tensor:
        """``estimate="sliced"``: each rank estimates only its slice of the coordinates and
        proposes its top ceil(c / P); a Bruck all-gather of the proposals (headed int32/int64
        index blocks, checked: header, range of the sender's slice, strictly ascending) gives
        every rank the same candidates, ascending. The estimate's N-sized work is cut by P."""
        comm, rank, size = self.comm, self.comm.rank, self.comm.size
        bounds, quotas = self.slice_quotas(n, size, wanted)
        lo, hi = bounds[rank], bounds[rank + 1]
        with self.timed("select"):
            mine = self.heavymix(table, n, k, quotas[rank], lo, hi) if quotas[rank] else \
                torch.empty(0, dtype=torch.int64, device=table.device)
        idx_dtype = index_dtype_for(n)
        isize = idx_dtype.itemsize
        block_nbytes = [HEADER_NBYTES + q * isize for q in quotas]
        block = torch.empty(block_nbytes[rank], dtype=torch.uint8, device=table.device)
        block[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, rank, n, quotas[rank], idx_dtype)))
        block[HEADER_NBYTES:].view(idx_dtype).copy_(mine)
        parts = []
        for owner, got in enumerate(bruck_allgather(comm, block, block_nbytes)):
            if owner == rank:
                parts.append(mine)
                continue
            check_header(got, receiver=rank, sender=owner, kind=Kind.DENSE, n=n, value_dtype=idx_dtype,
                         count=quotas[owner])
            idx = got[HEADER_NBYTES:].view(idx_dtype).to(torch.int64)
            if idx.numel() and (int(idx[0]) < bounds[owner] or int(idx[-1]) >= bounds[owner + 1]
                                or not bool((idx[1:] > idx[:-1]).all())):
                raise WireFormatError(f"rank {rank} received from rank {owner} gssgd candidates that are not "
                                      f"strictly ascending inside its slice [{bounds[owner]}, {bounds[owner + 1]})")
            parts.append(idx)
        return torch.cat(parts)

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        n = acc.numel()
        self._step += 1
        if n == 0 or min(k, n) == 0:
            out.zero_()
            self.last_nnz = 0
            return
        k, rows, cols, wanted = self._shape(n, k, self.options)
        if not self._warned and rows * cols * 4 >= n * acc.element_size():
            self._warned = True
            warnings.warn(f"gssgd: the sketch ({rows} x {cols} float32, {rows * cols * 4} bytes) is as large as "
                          f"the dense gradient ({n} x {acc.element_size()} bytes): dense sends less; lower "
                          "sketch_size, columns or rows, or use another algorithm for this tensor",
                          RuntimeWarning, stacklevel=2)
        seed, p1 = self.options["seed"], self.options["p1"]
        with self.timed("select"):
            table = torch.zeros(rows, cols, dtype=torch.float32, device=acc.device)
            if p1 is None:
                ops.sketch_build_(table, acc, seed)
            else:  # Sketched-SGD's first truncation: only the local top-p1*k enter the sketch
                values, indices = ops.topk(acc, min(n, math.ceil(p1 * k)))
                ops.sketch_build_coo_(table, indices, values.float(), n, seed)
        self._allreduce_(table.view(-1), n)
        if self.options["estimate"] == "sliced" and self.comm.size > 1:
            candidates = self._sliced_candidates(table, n, k, wanted)  # times its own selection
        else:
            with self.timed("select"):
                candidates = self.heavymix(table, n, k, wanted)
        with self.timed("select"):
            exact = ops.gather(acc, candidates)
        self._allreduce_(exact, n)
        with self.timed("merge"):
            if candidates.numel() > k:  # the exact top-k of the summed candidates, identical on every rank
                values, positions = ops.topk(exact, k)
                candidates, exact = candidates[positions], values
            acc.index_fill_(0, candidates, 0)  # what this rank contributed leaves its residual
            ops.scatter_set_(out, candidates, exact, zero_rest=True)  # distinct candidates
        self.last_nnz = k

    traffic_model = "exact"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """:meth:`rank_traffic` (the slowest rank's bytes and rounds, checked against the
        simulated Comm rank by rank in tests/test_gssgd.py) given to every rank, the bytes
        spread evenly over the rounds (:meth:`Traffic.spread`)."""
        nbytes, rounds = cls.rank_traffic(P, N, k, value_size=dtype.itemsize, **options)
        t = Traffic.spread(P, nbytes, rounds)
        t.notes.append("gssgd.rank_traffic")
        return t
