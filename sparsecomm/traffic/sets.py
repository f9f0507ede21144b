"""The ranks' selected index sets (:class:`IndexSets`) the set-based message schedules need, and a
model of real gradients' sets (:func:`model_sets`, :func:`default_sets`) for when the real ones
are not at hand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IndexSets", "union_sorted", "model_sets", "default_sets"]


@dataclass
class IndexSets:
    """The ranks' selected indices (sorted int64 numpy arrays over [0, n)).

    ``scale`` > 1 stands for a vector ``scale`` times longer than ``n`` with the same structure:
    every count and position is multiplied by it (the scale study draws sets at a model length
    and scales them to N, so P = 1024 stays small)."""

    sets: list[np.ndarray]
    n: int
    scale: float = 1.0

    def count(self, arr_or_len) -> int:
        """``len`` (or a count) scaled to N."""
        m = arr_or_len if isinstance(arr_or_len, (int, np.integer)) else len(arr_or_len)
        return int(round(m * self.scale))


def union_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union of two sorted arrays of distinct indices (a sort, not numpy's hash-based unique)."""
    c = np.concatenate([a, b])
    c.sort(kind="stable")
    if len(c) < 2:
        return c
    return c[np.concatenate([[True], c[1:] != c[:-1]])]


def model_sets(size: int, n: int, k: int, overlap: float = 0.10, hot_fraction: float = 0.25,
               hot_share: float = 0.60, regions: int = 64, seed: int = 0) -> list[np.ndarray]:
    """Index sets drawn from a model of real gradients' local top-k (measured on the digits MLP,
    docs/scale.md): a fraction ``overlap`` of every rank's k indices comes from one pool shared by
    all ranks, the rest is the rank's own; both are drawn with ``hot_share`` of the indices in a
    fixed ``hot_fraction`` of ``regions`` equal index ranges (the layers that carry the large
    gradients), uniformly inside a range. Sorted, distinct; about k per rank."""
    rng = np.random.default_rng(seed)
    hot_regions = rng.choice(regions, max(1, round(hot_fraction * regions)), replace=False)
    is_hot = np.zeros(regions, dtype=bool)
    is_hot[hot_regions] = True
    bounds = [r * n // regions for r in range(regions + 1)]

    def draw(m: int) -> np.ndarray:
        hot = rng.random(m) < hot_share
        pick = np.where(hot, rng.choice(np.flatnonzero(is_hot), m), rng.choice(np.flatnonzero(~is_hot), m))
        lo = np.asarray(bounds)[pick]
        hi = np.asarray(bounds)[pick + 1]
        return lo + (rng.random(m) * np.maximum(hi - lo, 1)).astype(np.int64)

    shared_k = int(round(overlap * k))
    pool = union_sorted(draw(2 * shared_k + 1), np.empty(0, np.int64))[: max(1, 2 * shared_k)]
    out = []
    for _ in range(size):
        common = rng.choice(pool, min(shared_k, len(pool)), replace=False) if shared_k else np.empty(0, np.int64)
        own = draw(k - len(common) + k // 20 + 1)
        s = union_sorted(np.sort(common), own)
        if len(s) > k:
            s = np.sort(rng.choice(s, k, replace=False))
        out.append(s.astype(np.int64))
    return out


def default_sets(P: int, N: int, k: int, model_n: int = 1 << 20, seed: int = 0) -> IndexSets:
    """Model index sets at length min(N, model_n), scaled to N."""
    n_model = min(N, model_n)
    k_model = max(1, round(k * n_model / N)) if N else 0
    return IndexSets(model_sets(P, n_model, k_model, seed=seed), n_model, N / n_model if n_model else 1.0)
