"""Count-Sketch in torch (``csrc/include/sparsecomm/sketch.h``): the same hash family, so
tables built here and by the C kernels are interchangeable; builds sum with ``index_add_``."""

from __future__ import annotations

from typing import Tuple

import torch

from .checks import (check_contiguous, check_index_range, check_indices, check_nonnegative, check_same_length,
                     check_values, check_vector, first_true)
from .splitmix import MASK64, mix64, srl, u64

__all__ = ["RUN", "MAX_ROWS", "sketch_build_coo_", "sketch_build_", "sketch_estimate_at", "sketch_estimate"]

RUN = 16  # coordinates per run of the Count-Sketch hash family (SC_SKETCH_RUN in sketch.h)
MAX_ROWS = 64  # SC_SKETCH_MAX_ROWS


def _row_keys(rows: int, seed: int, device) -> torch.Tensor:
    base = torch.tensor([u64((seed & MASK64) + 0x9E3779B97F4A7C15 * (j + 1)) for j in range(rows)],
                        dtype=torch.int64, device="cpu")
    return mix64(base).to(device)


def _hashes(rows: int, cols: int, idx: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bucket, sign) of every (row, coordinate): sketch.h's hash family."""
    off = idx & (RUN - 1)
    h = mix64(_row_keys(rows, seed, idx.device)[:, None] ^ (idx // RUN)[None, :])
    hi = srl(h, 32)
    # ((hi * cols) >> 32) exactly for hi, cols < 2^32: split hi in 16-bit halves
    first = ((hi >> 16) * cols + (((hi & 0xFFFF) * cols) >> 16)) >> 16
    bucket = (first + off[None, :]) % cols
    sign = 1 - 2 * ((h >> off[None, :]) & 1)
    return bucket, sign


def _check_table(table: torch.Tensor, op: str, written: bool) -> None:
    if table.dim() != 2:
        raise ValueError(f"{op}: table must be a 2-D (rows x cols) tensor, got shape {tuple(table.shape)}")
    if not 1 <= table.shape[0] <= MAX_ROWS:
        raise ValueError(f"{op}: table must have 1..{MAX_ROWS} rows, got {table.shape[0]}")
    if not 1 <= table.shape[1] <= 0xFFFFFFFF:
        raise ValueError(f"{op}: table must have 1..2^32-1 columns, got {table.shape[1]}")
    check_values(table, op, "table", full=True)
    if written:
        check_contiguous(table, op, "table")


def _build(table: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, seed: int) -> None:
    if idx.numel() == 0:
        return
    bucket, sign = _hashes(table.shape[0], table.shape[1], idx, seed)
    v = val.to(table.dtype)
    for j in range(table.shape[0]):  # index_add_: in input order on CPU (the C kernel's)
        table[j].index_add_(0, bucket[j], v * sign[j].to(table.dtype))


def sketch_build_coo_(table: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, n: int, seed: int) -> None:
    op = "sparsecomm.sketch_build_coo_"
    _check_table(table, op, True)
    check_nonnegative(n, op, "n")
    check_vector(val, op, "val")
    check_values(val, op, "val", full=True)
    check_vector(idx, op, "idx")
    check_indices(idx, op, "idx")
    check_same_length(idx, val, op, "idx", "val")
    check_index_range(op, idx, n)
    keep = val != 0  # the C kernel skips zero values (a -0.0 in the table stays)
    _build(table, idx.to(torch.int64)[keep], val[keep], seed)


def sketch_build_(table: torch.Tensor, x: torch.Tensor, seed: int) -> None:
    op = "sparsecomm.sketch_build_"
    _check_table(table, op, True)
    check_vector(x, op, "x")
    check_values(x, op, "x", full=True)
    # every coordinate, zeros included (they add +-0, as in the C kernel)
    _build(table, torch.arange(x.numel(), dtype=torch.int64, device=x.device), x, seed)


def sketch_estimate_at(table: torch.Tensor, idx: torch.Tensor, seed: int,
                       op: str = "sparsecomm.sketch_estimate_at") -> torch.Tensor:
    _check_table(table, op, False)
    check_vector(idx, op, "idx")
    check_indices(idx, op, "idx")
    idx = idx.to(torch.int64)
    if idx.numel():
        p = first_true(idx < 0)
        if p is not None:
            raise ValueError(f"{op}: idx must hold indices >= 0, but idx[{p}] = {int(idx[p])}")
    rows = table.shape[0]
    bucket, sign = _hashes(rows, table.shape[1], idx, seed)
    est = torch.gather(table.contiguous(), 1, bucket) * sign.to(table.dtype)
    s = est.sort(dim=0).values
    if rows % 2:
        return s[rows // 2].contiguous()
    return ((s[rows // 2 - 1] + s[rows // 2]) / 2).contiguous()


def sketch_estimate(table: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    op = "sparsecomm.sketch_estimate"
    _check_table(table, op, False)
    check_nonnegative(n, op, "n")
    return sketch_estimate_at(table, torch.arange(n, dtype=torch.int64, device=table.device), seed, op)
