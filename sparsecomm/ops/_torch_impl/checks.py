"""The argument and data checks the torch implementations share: what ``csrc/checks.h`` and
the C kernels check, with the same errors (ValueError, TypeError) and words."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["HALF_FLOATS", "FULL_FLOATS", "check_vector", "check_values", "check_indices", "check_same_dtype",
           "check_same_length", "check_nonnegative", "check_contiguous", "overlaps", "first_true", "check_no_nan",
           "check_sorted", "check_index_range"]

HALF_FLOATS = (torch.float16, torch.bfloat16)
_ALL_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
FULL_FLOATS = (torch.float32, torch.float64)


def check_vector(t: torch.Tensor, op: str, name: str) -> None:
    if t.dim() != 1:
        raise ValueError(f"{op}: {name} must be a 1-D tensor, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")


def check_values(t: torch.Tensor, op: str, name: str, full: bool = False) -> None:
    allowed = FULL_FLOATS if full else _ALL_FLOATS
    if t.dtype not in allowed:
        words = "float32 or float64" if full else "float32, float64, float16 or bfloat16"
        raise TypeError(f"{op}: {name} must be {words}, got {t.dtype}")


def check_indices(t: torch.Tensor, op: str, name: str) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")


def check_same_dtype(a: torch.Tensor, b: torch.Tensor, op: str, an: str, bn: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {bn} must have the dtype of {an} ({a.dtype}), got {b.dtype}")


def check_same_length(a: torch.Tensor, b: torch.Tensor, op: str, an: str, bn: str) -> None:
    if a.numel() != b.numel():
        raise ValueError(f"{op}: {an} and {bn} must have the same length, got {a.numel()} and {b.numel()}")


def check_nonnegative(v: int, op: str, name: str) -> None:
    if v < 0:
        raise ValueError(f"{op}: {name} must be >= 0, got {v}")


def check_contiguous(t: torch.Tensor, op: str, name: str) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (it is written in place)")


def _byte_range(t: torch.Tensor) -> Tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the bytes of two (contiguous) tensors share anything?"""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def first_true(mask: torch.Tensor) -> Optional[int]:
    """Position of the first True, or None (one host synchronisation)."""
    hit = mask.nonzero()
    return int(hit[0]) if hit.numel() else None


def check_no_nan(x: torch.Tensor, op: str, name: str = "x") -> None:
    if x.numel():
        p = first_true(torch.isnan(x))
        if p is not None:
            raise ValueError(f"{op}: {name}[{p}] is NaN: top-k by magnitude is undefined for NaN "
                             "(clean or mask the tensor first)")


def check_sorted(op: str, i: torch.Tensor, name: str, n: Optional[int]) -> None:
    """Strictly ascending and inside [0, n) in full (the C kernels' fused check: the first
    fault by position is reported)."""
    if i.numel() == 0:
        return
    bad_order = torch.zeros_like(i, dtype=torch.bool)
    bad_order[1:] = i[1:] <= i[:-1]
    bad_range = (i < 0) if n is None or n < 0 else ((i < 0) | (i >= n))
    p = first_true(bad_order | bad_range)
    if p is None:
        return
    v = int(i[p])
    if bool(bad_range[p]):
        bound = ">= 0" if v < 0 else f"< {n}"
        raise ValueError(f"{op}: {name} must hold indices {bound}, but {name}[{p}] = {v}")
    raise ValueError(f"{op}: {name} must be strictly ascending (sorted, no duplicates), but "
                     f"{name}[{p}] = {v} does not follow the entry before it")


def check_index_range(op: str, idx: torch.Tensor, limit: int) -> None:
    if idx.numel():
        p = first_true((idx < 0) | (idx >= limit))
        if p is not None:
            v = int(idx[p])
            bound = ">= 0" if v < 0 else f"< {limit}"
            raise ValueError(f"{op}: idx must hold indices {bound}, but idx[{p}] = {v}")
