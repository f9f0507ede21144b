"""Count-Sketch kernels (gs-SGD, section 3): build, merge, estimate, heavy hitters.

A sketch is a ``rows x cols`` float32 or float64 table. Coordinates come in runs of
``RUN = 16`` consecutive ones (run ``r = i // 16``, offset ``o = i % 16``); in row ``j``
one 64-bit hash of the run, computed on the fly (no ``rows x N`` tables), places the
whole run on 16 consecutive buckets and gives its 16 signs::

    mix(z)       splitmix64 finaliser (xor-shift 30, *0xBF58476D1CE4E5B9, xor-shift 27,
                 *0x94D049BB133111EB, xor-shift 31), arithmetic mod 2^64
    key_j        mix(seed + 0x9E3779B97F4A7C15 * (j + 1))
    h            mix(key_j ^ r)
    bucket_j(i)  ((((h >> 32) * cols) >> 32) + o) mod cols
    sign_j(i)    +1 if bit o of h is 0, -1 if it is 1

A run is then one vector access to the table instead of 16 random ones (the kernels are
memory-bound: 6-7x faster builds and 4-5x faster estimates than with one hash per
coordinate at N = 15M, see docs/gssgd.md). Two coordinates of different runs collide with probability
1/cols, as with one hash per coordinate; two of the same run never do (cols >= 16).

Every rank that shares ``seed`` (and rows, cols) builds compatible sketches. The sketch is
linear: ``build(a) + build(b) == build(a + b)`` up to the rounding of the table dtype
(exactly when no addition rounds, e.g. integer-valued inputs below 2^24 for float32
tables, or a float64 table of float32 inputs that are multiples of a common power of two
with few significant bits). Accumulation happens in the table dtype, in increasing index
order per row, so results do not depend on the thread count.

``sketch_estimate`` gives the median over rows of ``sign_j(i) * table[j, bucket_j(i)]``
(mean of the two middle values when rows is even).

CPU tensors run the C kernels of ``csrc/cpu/sketch.c`` (OpenMP over rows for builds,
over coordinates for estimates) through ``csrc/ops_sketch.cpp``. Other devices use the
torch implementation of ``ops._torch_impl`` (same hash, same semantics, not tuned).
"""
from __future__ import annotations

import operator
from typing import Tuple

import torch

from ._coo import topk
from ._errors import translating
from ._torch_impl import RUN

__all__ = [
    "sketch_new",
    "sketch_build_",
    "sketch_build_coo_",
    "sketch_merge_",
    "sketch_estimate",
    "sketch_estimate_at",
    "sketch_l2sq",
    "sketch_heavy_hitters",
    "MAX_ROWS",
    "RUN",
]

_ops = torch.ops.sparsecomm
_MASK = (1 << 64) - 1
MAX_ROWS = 64  # SC_SKETCH_MAX_ROWS in sketch.h


def _seed(seed) -> int:
    s = operator.index(seed) & _MASK
    return s - (1 << 64) if s >= 1 << 63 else s  # the op schema takes a signed int64


def _work(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 inputs are sketched as float32 (the kernels take float32/64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def sketch_new(rows: int, cols: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """An empty (all-zero) ``rows x cols`` sketch table."""
    rows, cols = operator.index(rows), operator.index(cols)
    if not (1 <= rows <= MAX_ROWS) or cols < 1:
        raise ValueError(f"sketch_new: need 1 <= rows <= {MAX_ROWS} and cols >= 1, got {rows} x {cols}")
    return torch.zeros(rows, cols, dtype=dtype, device=device)


@translating
def sketch_build_(table: torch.Tensor, x: torch.Tensor, seed: int) -> torch.Tensor:
    """Add the sketch of the dense 1-D vector ``x`` into ``table`` in place; returns it.

    One pass over ``x`` per row of the table (a row stays in cache for its pass).
    float16/bfloat16 inputs are converted to float32 first.
    """
    _ops.sketch_build_(table, _work(x), _seed(seed))
    return table


@translating
def sketch_build_coo_(table: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, n: int,
                      seed: int) -> torch.Tensor:
    """Add the sketch of the COO vector ``(idx, val)`` of length ``n`` into ``table``.

    ``idx`` int32/int64 in ``[0, n)`` (any order, repeats add up; checked before the
    table is written); equals ``sketch_build_`` of the dense vector when indices are
    unique.
    """
    _ops.sketch_build_coo_(table, idx, _work(val), n, _seed(seed))
    return table


def sketch_merge_(table: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``table += other`` (sketches of the same shape, seed and dtype add up: linearity)."""
    if table.shape != other.shape or table.dtype != other.dtype:
        raise ValueError(f"sketch_merge_: sketches differ: {tuple(table.shape)} {table.dtype} vs "
                         f"{tuple(other.shape)} {other.dtype}")
    return table.add_(other)


@translating
def sketch_estimate(table: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Estimates of all coordinates ``0..n-1`` (table dtype): median over rows."""
    return _ops.sketch_estimate(table, n, _seed(seed))


@translating
def sketch_estimate_at(table: torch.Tensor, idx: torch.Tensor, seed: int) -> torch.Tensor:
    """Estimates of the coordinates ``idx`` (int32/int64 >= 0, any order)."""
    return _ops.sketch_estimate_at(table, idx, _seed(seed))


def sketch_l2sq(table: torch.Tensor) -> float:
    """Estimate of ``||x||_2^2``: median over rows of the row's sum of squares."""
    sums = table.double().pow(2).sum(dim=1).sort().values
    r = table.shape[0]
    return float(sums[r // 2]) if r % 2 else float(sums[r // 2 - 1:r // 2 + 1].mean())


def sketch_heavy_hitters(table: torch.Tensor, n: int, k: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k, n)`` coordinates with the largest estimated magnitude.

    Returns ``(estimates, indices)``: indices int64 ascending, ties in ``|estimate|``
    broken by the lower index (the rule of :func:`sparsecomm.ops.topk`).
    """
    return topk(sketch_estimate(table, n, seed), k)
