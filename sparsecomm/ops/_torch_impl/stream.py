"""Dense-stream addition, sparse-stream concatenation and QSGD in torch
(``csrc/include/sparsecomm/stream.h``): the C kernels' layout and splitmix64 draws."""

from __future__ import annotations

import torch

from .._errors import WIRE_PREFIX
from .checks import (FULL_FLOATS, check_contiguous, check_indices, check_nonnegative, check_same_dtype,
                     check_same_length, check_sorted, check_values, check_vector, first_true, overlaps)
from .splitmix import mix64, srl, u64

__all__ = ["stream_add_dd_", "stream_concat", "qsgd_uniform", "qsgd_quantize", "qsgd_dequantize"]

_FLT_MAX = 3.4028234663852886e38


def stream_add_dd_(a: torch.Tensor, b: torch.Tensor) -> None:
    op = "sparsecomm.stream_add_dd_"
    check_vector(a, op, "a")
    check_vector(b, op, "b")
    check_contiguous(a, op, "a")
    check_same_length(a, b, op, "a", "b")
    check_same_dtype(a, b, op, "a", "b")
    check_values(a, op, "a", full=True)
    bc = b.contiguous()
    if bc.data_ptr() != a.data_ptr() and overlaps(a, bc):
        raise ValueError(f"{op}: b partially overlaps the tensor written in place; pass a copy")
    a.add_(bc)


def stream_concat(idx_a, val_a, idx_b, val_b):
    op = "sparsecomm.stream_concat"
    for t, name in ((idx_a, "idx_a"), (val_a, "val_a"), (idx_b, "idx_b"), (val_b, "val_b")):
        check_vector(t, op, name)
    check_same_length(idx_a, val_a, op, "idx_a", "val_a")
    check_same_length(idx_b, val_b, op, "idx_b", "val_b")
    check_same_dtype(idx_a, idx_b, op, "idx_a", "idx_b")
    check_same_dtype(val_a, val_b, op, "val_a", "val_b")
    check_indices(idx_a, op, "idx_a")
    check_values(val_a, op, "val_a")
    check_sorted(op, idx_a, "idx_a", None)
    check_sorted(op, idx_b, "idx_b", None)
    if idx_a.numel() and idx_b.numel() and int(idx_b[0]) <= int(idx_a[-1]):
        raise ValueError(f"{op}: idx_b must be strictly ascending (sorted, no duplicates), but idx_b[0] = "
                         f"{int(idx_b[0])} does not follow the entry before it")
    return torch.cat([idx_a, idx_b]), torch.cat([val_a, val_b])


def _qsgd_check(op: str, bits: int, bucket: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"{op}: bits must be 4 or 8, got {bits}")
    if bucket < 1 or (bits == 4 and bucket % 2):
        raise ValueError(f"{op}: bucket_size must be >= 1 (and even for 4 bits), got {bucket}")


def qsgd_uniform(seed: int, n: int, device) -> torch.Tensor:
    """The C kernel's draws (stream.c, qsgd_u01): element i gets the top 53 bits of
    splitmix64 of seed ^ (i * 0xD1B54A32D192ED03), as a float64 in [0, 1)."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    state = (i * u64(0xD1B54A32D192ED03)) ^ u64(seed)
    z = mix64(state + u64(0x9E3779B97F4A7C15))
    return srl(z, 11).to(torch.float64) * (1.0 / 9007199254740992.0)


def qsgd_quantize(x: torch.Tensor, bits: int, bucket_size: int, seed: int):
    """The C kernel's layout and draws (splitmix64 of (seed, index)): bit-identical."""
    op = "sparsecomm.qsgd_quantize"
    check_vector(x, op, "x")
    _qsgd_check(op, bits, bucket_size)
    check_values(x, op, "x", full=True)
    xf = x.to(torch.float64)
    n, s = xf.numel(), (1 << (bits - 1)) - 1
    p = first_true(~(xf.abs() <= _FLT_MAX))  # NaN, Inf, or a float64 no float32 scale holds
    if p is not None:
        raise ValueError(f"{op}: x[{p}] is NaN (or, for QSGD, infinite or beyond float32): this op cannot "
                         "order or scale it (clean or mask the tensor first)")
    nb = -(-n // bucket_size)
    padded = torch.zeros(nb * bucket_size, dtype=torch.float64, device=x.device)
    padded[:n] = xf.abs()
    m = padded.view(nb, bucket_size).amax(dim=1)
    scales = m.to(torch.float32)  # rounded to nearest, then up where that went below
    scales = torch.where(scales.double() < m, torch.nextafter(scales, torch.full_like(scales, float("inf"))),
                         scales)
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    r = torch.where(sc > 0, xf.abs() / sc * s, torch.zeros_like(xf))
    lv = torch.floor(r)
    lv = lv + (qsgd_uniform(seed, n, x.device) < r - lv).to(torch.float64)
    lv = lv.clamp_max(s)
    q = torch.where(sc > 0, torch.where(xf < 0, s - lv, s + lv), torch.full_like(xf, s)).to(torch.uint8)
    if bits == 8:
        return q, scales
    if n % 2:
        q = torch.cat([q, q.new_zeros(1)])
    return (q[0::2] | (q[1::2] << 4)).contiguous(), scales


def qsgd_dequantize(packed, scales, n: int, bits: int, bucket_size: int, dtype: torch.dtype):
    op = "sparsecomm.qsgd_dequantize"
    check_vector(packed, op, "packed")
    check_vector(scales, op, "scales")
    _qsgd_check(op, bits, bucket_size)
    check_nonnegative(n, op, "n")
    if packed.dtype != torch.uint8:
        raise TypeError(f"{op}: packed must be uint8, got {packed.dtype}")
    if scales.dtype != torch.float32:
        raise TypeError(f"{op}: scales must be float32, got {scales.dtype}")
    if packed.numel() != (n * bits + 7) // 8:
        raise ValueError(f"{op}: packed must hold {(n * bits + 7) // 8} bytes for n = {n}, got {packed.numel()}")
    if scales.numel() != -(-n // bucket_size):
        raise ValueError(f"{op}: scales must hold {-(-n // bucket_size)} entries, got {scales.numel()}")
    if dtype not in FULL_FLOATS:
        raise TypeError(f"{op}: dtype must be float32 or float64, got {dtype}")
    s = (1 << (bits - 1)) - 1
    if bits == 8:
        q = packed.to(torch.int64)
    else:
        q = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1).to(torch.int64)
    # peer data, validated in full before anything is decoded (the C kernel's order)
    p = first_true(q[:n] > 2 * s)
    if p is not None:
        raise ValueError(f"{WIRE_PREFIX}{op}: packed is malformed at position {p if bits == 8 else p // 2} "
                         f"(a level above {2 * s})")
    if bits == 4 and n % 2 and int(q[n]) != 0:
        raise ValueError(f"{WIRE_PREFIX}{op}: packed is malformed at position {n // 2} (a non-zero unused nibble)")
    p = first_true(~(torch.isfinite(scales) & (scales >= 0)))
    if p is not None:
        raise ValueError(f"{WIRE_PREFIX}{op}: scales is malformed at position {p} (must be finite and >= 0)")
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    # divided by a tensor, not a Python number: CUDA divides by a host scalar as a product with
    # its reciprocal, which rounds differently from the C kernel's division
    divisor = torch.full((), float(s), dtype=torch.float64, device=sc.device)
    return ((q[:n] - s).double() * sc / divisor).to(dtype)
