"""``auto``: pick the fastest algorithm for each tensor from the cost models.

For users who do not know which algorithm suits their network, model and scale. Before the
first call for a tensor (the reducer's ``prepare`` step, before its signature handshake) every
rank

1. takes alpha and beta: the options when given, else a short ping-pong between ranks 0 and 1
   through the Comm (1 KB, 64 KB and 1 MB, three trips each, half round trips, least squares:
   :func:`sparsecomm.bench.fit_alpha_beta`), done once per Comm and reused by every reducer on
   it; rank 0's fit is all-gathered and every rank uses rank 0's values, so the inputs of the
   decision are identical everywhere;
2. predicts each candidate's time per call: the alpha-beta time of its message schedule
   (:mod:`sparsecomm.costmodel`, with index sets from its model of real gradients) plus its
   local compute, ``compute_ns[name](density) * N`` (a per-element coefficient measured once,
   :data:`COMPUTE_NS`, interpolated in log density; ``compute`` overrides it);
3. runs the cheapest (ties: the order of ``candidates``). The choice is part of the handshake's
   algorithm field (``auto/topka``, ``auto/gssgd/<its wire revision>``), so ranks that chose differently raise instead of
   exchanging mismatched messages.

``last_stats`` gets ``auto_choice``, ``auto_predicted_s`` (the model's time of the choice),
``auto_measured_s`` (the call's wall time), ``auto_alpha`` and ``auto_beta``. The choice and
the chosen algorithm's state are in ``state_dict()``: a resumed reducer keeps the choice (no
new ping-pong, no new decision for the same N and k).

Options: ``alpha``, ``beta`` (None: ping-pong), ``candidates`` (a tuple of algorithm names;
default :data:`CANDIDATES`), ``compute`` (None or a dict name -> ns per element).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from typing import Any

import torch

from .base import Algorithm, get, register

__all__ = ["AutoAlgorithm", "choose_algorithm", "CANDIDATES", "COMPUTE_NS"]

#: the algorithms auto chooses among, in order of preference on equal predictions (gssgd is
#: left out: the scale study's model finds it slower than gtopk at every P up to 1024;
#: docs/scale.md)
CANDIDATES = ("dense", "topka", "spardl", "gtopk", "sparcml_recursive_double", "sparcml_split_allgather",
              "topkdsa", "oktopk", "densestream")

#: local compute per element of N (ns) at densities 0.1%, 1%, 5%: the measured wall time per
#: call at P = 4, N = 15M on the emulated 1 Gbit/s cluster (docs/benchmarks.md, docs/densestream.md
#: Table II; 4 ranks on 2 shared cores) less the modelled wire time of its schedule, divided by N
#: (calibration in docs/scale.md). oktopk and densestream were not measured at 0.1%: their 1%
#: value stands in. skcompress: simulated P = 4, N = 2M.
COMPUTE_NS: dict[str, tuple[float, float, float]] = {
    "dense": (3.55, 3.15, 4.08),
    "gtopk": (3.11, 4.18, 12.49),
    "sparcml_recursive_double": (2.85, 4.75, 16.11),
    "sparcml_split_allgather": (3.16, 4.72, 13.96),
    "spardl": (4.71, 4.98, 10.44),
    "topka": (3.79, 4.45, 18.24),
    "topkdsa": (25.59, 23.16, 28.33),
    "oktopk": (15.27, 15.27, 27.06),
    "densestream": (15.02, 15.02, 43.61),
    "gssgd": (27.88, 50.92, 156.87),
    "skcompress": (4.1, 27.5, 171.9),
}
_DENSITIES = (0.001, 0.01, 0.05)

# one fit per Comm (every reducer on it reuses it; every rank builds reducers in the same order)
_FITS: "weakref.WeakKeyDictionary[Any, tuple[float, float]]" = weakref.WeakKeyDictionary()


def compute_ns(name: str, density: float, table: dict | None = None) -> float:
    """Per-element compute (ns) of ``name`` at ``density``: piecewise linear in log density."""
    if table and name in table:
        return float(table[name])
    points = COMPUTE_NS.get(name, (10.0, 10.0, 10.0))
    x = math.log(min(max(density, _DENSITIES[0]), _DENSITIES[-1]))
    xs = [math.log(d) for d in _DENSITIES]
    for i in range(len(xs) - 1):
        if x <= xs[i + 1]:
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
            return points[i] * (1 - w) + points[i + 1] * w
    return points[-1]


def choose_algorithm(P: int, N: int, k: int, alpha: float, beta: float, sets=None, observed_k=None,
                     candidates=CANDIDATES, compute: dict | None = None, dtype: torch.dtype = torch.float32,
                     model_n: int = 1 << 16) -> dict:
    """The candidate with the least predicted time (schedule + compute); the same on every rank
    given the same arguments. Returns {"algorithm", "predicted_s", "predictions"}."""
    from .. import costmodel
    if P <= 1 or N == 0:
        return {"algorithm": "dense", "predicted_s": 0.0, "predictions": {"dense": 0.0}}
    density = k / N
    if sets is None:
        sets = costmodel.default_sets(P, N, k, model_n=model_n)
    preds = {}
    for name in candidates:
        try:
            sched = costmodel.traffic(name, P, N, k, sets=sets, dtype=dtype)
        except ValueError:
            continue   # e.g. options that do not fit P
        preds[name] = sched.time(alpha, beta) + compute_ns(name, density, compute) * 1e-9 * N
    best = min(preds, key=lambda n: (preds[n], list(candidates).index(n)))
    return {"algorithm": best, "predicted_s": preds[best], "predictions": preds}


def _pingpong_fit(comm) -> tuple[float, float]:
    """Rank 0's alpha-beta fit of a ping-pong with rank 1, the same on every rank."""
    from ..bench import fit_alpha_beta
    sizes = [1 << 10, 1 << 16, 1 << 20]
    halves = []
    for size in sizes:
        buf = torch.zeros(size, dtype=torch.uint8, device=comm.device)
        times = []
        for trip in range(4):   # the first trip warms the connection up
            start = time.perf_counter()
            if comm.rank == 0:
                comm.exchange([(1, buf)], [])
                comm.exchange([], [(1, buf)])
            elif comm.rank == 1:
                comm.exchange([], [(0, buf)])
                comm.exchange([(0, buf)], [])
            if trip:
                times.append((time.perf_counter() - start) / 2)
        halves.append(statistics.median(times))
    alpha, beta = fit_alpha_beta(sizes, halves) if comm.rank == 0 else (0.0, 0.0)
    table = comm.allgather_small(torch.tensor([alpha, beta], dtype=torch.float64, device="cpu")).cpu()
    return float(table[0, 0]), float(table[0, 1])


@register
class AutoAlgorithm(Algorithm):
    name = "auto"
    lossless = False   # the instance says what its choice is
    option_defaults = {"alpha": None, "beta": None, "candidates": None, "compute": None}

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        for key in ("alpha", "beta"):
            v = self.options[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not (math.isfinite(v) and v >= 0)):
                raise ValueError(f"auto: option {key} must be None (measured by a ping-pong) or a finite "
                                 f"number >= 0 (seconds; per byte for beta), got {v!r}")
        if (self.options["alpha"] is None) != (self.options["beta"] is None):
            raise ValueError("auto: give both alpha and beta, or neither (then a ping-pong measures both)")
        cands = self.options["candidates"]
        if cands is not None:
            if isinstance(cands, str) or not isinstance(cands, (tuple, list)) or not cands:
                raise ValueError(f"auto: option candidates must be a non-empty tuple of algorithm names, got {cands!r}")
            from .. import costmodel
            bad = [c for c in cands if c == "auto" or c not in costmodel.modelled()]
            if bad:
                raise ValueError(f"auto: candidates {bad} cannot be chosen; choose among {', '.join(costmodel.modelled())}")
            self.options["candidates"] = tuple(cands)
        comp = self.options["compute"]
        if comp is not None and (not isinstance(comp, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in comp.values())):
            raise ValueError(f"auto: option compute must be None or a dict name -> ns per element (finite, >= 0), "
                             f"got {comp!r}")
        self.choice: str | None = None
        self.inner: Algorithm | None = None
        self.decision: dict[str, Any] = {}
        self._pending: dict[str, Any] | None = None
        self._carried_fit: tuple[float, float] | None = None

    @property
    def wire_revision(self) -> str:   # the handshake's algorithm field names the choice
        if self.inner is None:
            return ""
        rev = self.inner.wire_revision
        return self.choice + (f"/{rev}" if rev else "")

    def prepare(self, n: int, k: int, dtype: torch.dtype) -> None:
        """Decide for a tensor of n elements (called by the reducer before its handshake, on
        every rank; may communicate)."""
        if self.inner is not None and self.decision.get("n") == n and self.decision.get("k") == k:
            return
        pending = self._pending
        if pending and pending.get("n") == n and pending.get("k") == k:
            self._pending = None
            self.decision = {key: pending[key] for key in ("n", "k", "alpha", "beta", "predicted_s")}
            self._adopt(pending["choice"])
            self.inner.load_state_dict(pending.get("inner", {}))
            return
        comm = self.comm
        alpha, beta = self.options["alpha"], self.options["beta"]
        if alpha is None and self._carried_fit is not None:
            alpha, beta = self._carried_fit
        elif alpha is None:
            if comm.size < 2:
                alpha, beta = 0.0, 0.0
            else:
                fit = _FITS.get(comm)
                if fit is None:
                    fit = _FITS[comm] = _pingpong_fit(comm)
                alpha, beta = fit
        pick = choose_algorithm(comm.size, n, k, float(alpha), float(beta),
                                candidates=self.options["candidates"] or CANDIDATES,
                                compute=self.options["compute"], dtype=dtype)
        self.decision = {"n": n, "k": k, "alpha": float(alpha), "beta": float(beta),
                         "predicted_s": pick["predicted_s"]}
        self._adopt(pick["algorithm"])

    def _adopt(self, choice: str) -> None:
        self.choice = choice
        self.inner = get(choice)(self.comm)
        self.lossless = self.inner.lossless

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        if self.inner is None or self.decision.get("n") != acc.numel() or self.decision.get("k") != k:
            self.prepare(acc.numel(), k, acc.dtype)   # without the reducer: decide here
        self.inner.times = self.times
        self.inner.last_nnz = None
        self.inner.reduce(acc, k, out)
        self.last_nnz = self.inner.last_nnz

    def stats_extra(self, total_s: float) -> dict[str, Any]:
        """Added to the reducer's ``last_stats``."""
        return {"auto_choice": self.choice, "auto_predicted_s": self.decision.get("predicted_s"),
                "auto_measured_s": total_s, "auto_alpha": self.decision.get("alpha"),
                "auto_beta": self.decision.get("beta")}

    def state_dict(self) -> dict[str, Any]:
        if self.inner is None:
            return dict(self._pending) if self._pending else {}
        return {"choice": self.choice, **{key: self.decision[key] for key in ("n", "k", "alpha", "beta", "predicted_s")},
                "inner": self.inner.state_dict()}

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The alpha-beta fit carries to a rebuilt bucket, so its decision does not depend on a
        new ping-pong (a resumed run decides as the uninterrupted one)."""
        return {"alpha": state["alpha"], "beta": state["beta"]} if "alpha" in state else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if set(state) == {"alpha", "beta"}:   # carried from another bucket
            self._carried_fit = (float(state["alpha"]), float(state["beta"]))
            return
        missing = {"choice", "n", "k", "alpha", "beta", "predicted_s"} - set(state)
        if missing:
            raise ValueError(f"auto: state lacks {sorted(missing)}")
        get(state["choice"])
        self.inner, self.choice, self.decision = None, None, {}
        self._pending = dict(state)
