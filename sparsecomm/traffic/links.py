"""A cluster's two links (:class:`Links`) and the alpha-beta fit of measured message times
(:func:`fit_alpha_beta`, the inverse of :meth:`Traffic.time <sparsecomm.traffic.Traffic.time>`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Links", "fit_alpha_beta"]


@dataclass(frozen=True)
class Links:
    """The two links of a cluster of nodes: ``alpha`` seconds per message and ``beta`` seconds
    per byte on the network between nodes (one NIC per node, shared by the node's ranks), and
    ``intra_alpha`` / ``intra_beta`` on the links inside a node (NVLink, PCIe, shared memory;
    each rank its own)."""

    alpha: float
    beta: float
    intra_alpha: float
    intra_beta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "intra_alpha", "intra_beta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"Links: {name} must be a number >= 0 (seconds), got {value!r}")


def fit_alpha_beta(sizes, times) -> tuple[float, float]:
    """Ordinary least squares on t = alpha + beta * bytes.

    beta is the slope (the large messages set it, as they should: tbf lets a burst of a few
    hundred KB through faster than the rate). When the intercept comes out negative,
    alpha = t - beta * bytes of the smallest message, clamped at 0.
    """
    x = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    A = np.stack([np.ones_like(x), x], 1)
    alpha, beta = (float(v) for v in np.linalg.lstsq(A, t, rcond=None)[0])
    if beta <= 0:
        beta = float(np.sum(x * t) / np.sum(x * x))
    if alpha < 0:
        i = int(np.argmin(x))
        alpha = max(0.0, float(t[i] - beta * x[i]))
    return alpha, beta
