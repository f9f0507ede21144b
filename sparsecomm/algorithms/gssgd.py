"""``gssgd``: gs-SGD ("A Distributed SGD Algorithm with Global Sketching for Deep Learning
Training Acceleration", section III-A, Algorithms 1 and 2), global Count-Sketch SGD.

One call:

1. each rank sketches ``acc`` (its gradient plus residual) into a ``rows x columns``
   float32 Count-Sketch (the ``sketch_*`` ops of :mod:`sparsecomm.ops`; every rank uses
   the same ``seed``);
2. the sketches are summed by recursive halving (Algorithm 1, lines 8-23): in each round
   the participants are paired in id order, the second of a pair sends its sketch to the
   first, which adds it; when the count of participants is odd, the largest id goes to the
   next round without sending (Figure 1). After ceil(log2 P) rounds rank 0 holds the sum;
   the same tree run backwards sends it to every rank (ceil(log2 P) more rounds), so every
   rank has the bit-identical summed sketch
   (:func:`sparsecomm.comm.collectives.halving_allreduce_`);
3. HEAVYMIX (Algorithm 2) picks k candidate indices from the summed sketch: the heavy set
   H = {i : est_i^2 >= ||g||^2 / k} (||g||^2 estimated as the median over rows of the row
   sums of squares), then ``heavymix="topk"`` (default) fills up with the largest remaining
   estimates -- i.e. the top-k of |est| with ties broken by the lower index -- while
   ``heavymix="random"`` fills with l = k - |H| indices drawn uniformly from the rest with a
   generator seeded by (seed, step), identical on every rank, as in the paper. When
   |H| > k the top-k of H by |est| is kept;
4. second round: each rank gathers its exact ``acc`` values at the k candidates and the
   k-vectors are summed with the same halving tree + broadcast back (2 ceil(log2 P) rounds);
   the output holds those sums at the candidates and zero elsewhere, bit-identical on
   every rank (the root's sum is broadcast);
5. each rank's residual is ``acc`` with its own values at the candidates removed: exactly
   what it contributed to the output, so conservation holds up to float rounding.

Options: ``rows`` (1..64, default 7), ``columns`` (>= 1, default None: max(256, 10 k)),
``seed`` (int, default 0x5EED), ``heavymix`` ("topk" or "random").

Cost per call: 4 ceil(log2 P) rounds for rank 0 (fewer for ranks that leave the tree
early); in all 2(P-1) sketch messages of 32 + 4 rows columns bytes and 2(P-1) value
messages of 32 + k s bytes (s the value size).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import ops
from ..comm.base import Comm
from ..comm.collectives import halving_allreduce_
from .base import Algorithm, register

__all__ = ["GlobalSketchSGD", "default_columns"]


def default_columns(k: int) -> int:
    """Default sketch width for k selected entries: max(256, 10 k)."""
    return max(256, 10 * k)


@register
class GlobalSketchSGD(Algorithm):
    name = "gssgd"
    lossless = False
    option_defaults = {"rows": 7, "columns": None, "seed": 0x5EED, "heavymix": "topk"}
    # the Count-Sketch hash family of csrc/include/sparsecomm/sketch.h (runs of 16 coordinates
    # on consecutive buckets): ranks whose builds hash differently would sum unrelated sketches
    wire_revision = "sketch-runs16"

    def __init__(self, comm: Comm, **options: Any):
        super().__init__(comm, **options)
        rows, cols, seed, fill = (self.options[key] for key in ("rows", "columns", "seed", "heavymix"))
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64:
            raise ValueError(f"gssgd: option rows must be an int in 1..64, got {rows!r}")
        # the sketch kernels take cols in [1, 2^32 - 1] (sketch.h)
        if cols is not None and (isinstance(cols, bool) or not isinstance(cols, int) or not 1 <= cols < 2**32):
            raise ValueError(f"gssgd: option columns must be None (auto: max(256, 10 k)) or an int in "
                             f"1..{2**32 - 1}, got {cols!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"gssgd: option seed must be an int, got {seed!r}")
        if fill not in ("topk", "random"):
            raise ValueError(f"gssgd: option heavymix must be 'topk' or 'random', got {fill!r}")
        self._step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._step = int(state.get("step", 0))

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {"step": state["step"]} if "step" in state else {}  # seeds randomness, not about the tensor

    def columns_for(self, k: int) -> int:
        return self.options["columns"] or default_columns(k)

    def heavymix(self, table: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Algorithm 2 on the summed sketch: k candidate indices, int64 ascending."""
        seed = self.options["seed"]
        est = ops.sketch_estimate(table, n, seed)
        if self.options["heavymix"] == "topk":
            return ops.topk(est, k)[1]
        threshold = ops.sketch_l2sq(table) / k
        heavy = (est.double().pow(2) >= threshold)
        h = int(heavy.sum())
        if h >= k:
            masked = torch.where(heavy, est, torch.zeros_like(est))
            return ops.topk(masked, k)[1]
        rest = (~heavy).nonzero().squeeze(1)
        # drawn on the host with a CPU generator, so every device picks the same indices
        gen = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + self._step) & 0x7FFFFFFFFFFFFFFF)
        perm = torch.randperm(rest.numel(), generator=gen, device="cpu")[:k - h]
        pick = rest[perm.to(rest.device)]
        return torch.cat([heavy.nonzero().squeeze(1), pick]).sort().values

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        comm, n = self.comm, acc.numel()
        k = min(k, n)
        self._step += 1
        if n == 0 or k == 0:
            out.zero_()
            self.last_nnz = 0
            return
        rows, cols, seed = self.options["rows"], self.columns_for(k), self.options["seed"]
        with self.timed("select"):
            table = torch.zeros(rows, cols, dtype=torch.float32, device=acc.device)
            ops.sketch_build_(table, acc, seed)
        halving_allreduce_(comm, table.view(-1), n)
        with self.timed("select"):
            candidates = self.heavymix(table, n, k)
            exact = ops.gather(acc, candidates)
        halving_allreduce_(comm, exact, n)
        with self.timed("merge"):
            acc.index_fill_(0, candidates, 0)  # what this rank contributed leaves its residual
            out.zero_()
            ops.scatter_add_(out, candidates, exact)
        self.last_nnz = k


def _rounds(size: int) -> int:
    return 4 * math.ceil(math.log2(size)) if size > 1 else 0
