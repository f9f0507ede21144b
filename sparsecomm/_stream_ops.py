"""Sparse-stream summation ops (SparCML section 3) and QSGD packing (section 5).

C kernels (csrc/cpu/stream.c) for CPU float32/float64 tensors; a plain torch fallback
for other devices and dtypes (same results, not the same speed). Re-exported by
:mod:`sparsecomm.ops`.

* ``stream_add_ss(idx_a, val_a, idx_b, val_b)`` -- sparse + sparse: merge of two strictly
  ascending COO vectors, equal indices summed as ``a + b``.
* ``stream_add_sd_(dense, idx, val)`` -- sparse + dense: ``dense[idx] += val`` in place.
* ``stream_add_dd_(a, b)`` -- dense + dense: ``a += b`` in place.
* ``stream_concat(idx_a, val_a, idx_b, val_b)`` -- disjoint ranges (every index of a
  below every index of b): concatenation.
* ``qsgd_quantize(x, bits, bucket_size, seed) -> (packed uint8, scales float32)`` and
  ``qsgd_dequantize(packed, scales, n, bits, bucket_size, dtype)``.
"""

from __future__ import annotations

from typing import Tuple

import torch

from . import _C  # noqa: F401  (registers torch.ops.sparsecomm.*)

__all__ = ["stream_add_ss", "stream_add_sd_", "stream_add_dd_", "stream_concat", "qsgd_quantize",
           "qsgd_dequantize"]

_ops = torch.ops.sparsecomm
_FAST = (torch.float32, torch.float64)


def _fast(*ts: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    return all(t.device.type == "cpu" for t in ts) and (dtype or ts[-1].dtype) in _FAST


def _check_ascending(op: str, idx: torch.Tensor, name: str) -> None:
    if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
        raise ValueError(f"{op}: {name} must be strictly ascending")


def stream_add_ss(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
                  val_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum of two sparse streams (sorted COO): returns (indices, values), sorted."""
    if _fast(idx_a, val_a, idx_b, val_b):
        return _ops.stream_add_ss(idx_a, val_a, idx_b, val_b)
    op = "sparsecomm.stream_add_ss"
    _check_ascending(op, idx_a, "idx_a")
    _check_ascending(op, idx_b, "idx_b")
    idx = torch.cat([idx_a, idx_b])
    uniq, inverse = torch.unique(idx, sorted=True, return_inverse=True)
    val = torch.zeros(uniq.numel(), dtype=val_a.dtype, device=val_a.device)
    val.index_add_(0, inverse[:idx_a.numel()], val_a)   # a first, then b: a + b
    val.index_add_(0, inverse[idx_a.numel():], val_b)
    return uniq.to(idx_a.dtype), val


def stream_add_sd_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """Sparse into dense, in place: ``dense[idx] += val`` (indices distinct)."""
    if _fast(dense, idx, val):
        return _ops.stream_add_sd_(dense, idx, val)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= dense.numel()):
        raise ValueError(f"sparsecomm.stream_add_sd_: idx must hold indices in [0, {dense.numel()})")
    return dense.index_add_(0, idx.to(torch.int64), val.to(dense.dtype))


def stream_add_dd_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dense into dense, in place: ``a += b``."""
    if _fast(a, b) and a.is_contiguous():
        return _ops.stream_add_dd_(a, b)
    return a.add_(b)


def stream_concat(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
                  val_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Disjoint, ordered ranges: (cat(idx_a, idx_b), cat(val_a, val_b)), order checked."""
    if _fast(idx_a, val_a, idx_b, val_b):
        return _ops.stream_concat(idx_a, val_a, idx_b, val_b)
    idx = torch.cat([idx_a, idx_b])
    _check_ascending("sparsecomm.stream_concat", idx, "cat(idx_a, idx_b)")
    return idx, torch.cat([val_a, val_b])


def _qsgd_check(bits: int, bucket_size: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"qsgd: bits must be 4 or 8, got {bits!r}")
    if bucket_size < 1 or (bits == 4 and bucket_size % 2):
        raise ValueError(f"qsgd: bucket_size must be >= 1 (even for 4 bits), got {bucket_size!r}")


def qsgd_quantize(x: torch.Tensor, bits: int, bucket_size: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """QSGD stochastic quantization of a 1-D tensor: (packed uint8, per-bucket float32 scales)."""
    _qsgd_check(bits, bucket_size)
    seed = int(seed) & (2**63 - 1)
    if _fast(x):
        return _ops.qsgd_quantize(x, bits, bucket_size, seed)
    # torch fallback: same layout, torch's generator (not bit-identical to the C kernel)
    xf = x.to(torch.float64)
    n, s = xf.numel(), (1 << (bits - 1)) - 1
    nb = -(-n // bucket_size)
    padded = torch.zeros(nb * bucket_size, dtype=torch.float64, device=x.device)
    padded[:n] = xf
    scales = padded.abs().view(nb, bucket_size).amax(dim=1).to(torch.float32)
    scales = torch.where(scales.double() < padded.abs().view(nb, -1).amax(dim=1),
                         torch.nextafter(scales, torch.full_like(scales, float("inf"))), scales)
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    r = torch.where(sc > 0, xf.abs() / sc.clamp_min(1e-300) * s, torch.zeros_like(xf))
    gen = torch.Generator(device=x.device).manual_seed(seed)
    lv = torch.floor(r) + (torch.rand(n, generator=gen, dtype=torch.float64, device=x.device) < r - torch.floor(r))
    q = (s + torch.sign(xf) * lv.clamp_max(s)).to(torch.uint8)
    if bits == 8:
        return q, scales
    if n % 2:
        q = torch.cat([q, q.new_zeros(1)])
    return (q[0::2] | (q[1::2] << 4)).contiguous(), scales


def qsgd_dequantize(packed: torch.Tensor, scales: torch.Tensor, n: int, bits: int, bucket_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`qsgd_quantize`: a dense tensor of ``n`` values in ``dtype``."""
    _qsgd_check(bits, bucket_size)
    if _fast(packed, scales, dtype=dtype):
        return _ops.qsgd_dequantize(packed, scales, n, bits, bucket_size, dtype)
    s = (1 << (bits - 1)) - 1
    if bits == 8:
        q = packed[:n].to(torch.int64)
    else:
        q = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[:n].to(torch.int64)
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    return ((q - s).double() * sc / s).to(dtype)
