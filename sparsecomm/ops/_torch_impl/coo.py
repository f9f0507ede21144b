"""Top-k, block top-k, COO merges, scatters, gathers and the non-finite flags in torch
(``csrc/include/sparsecomm/kernels.h``): bit-identical to the C kernels, scatters with
repeated indices in ``index_add_``'s order."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .._coo import NONFINITE_NAN, NONFINITE_NEG_INF, NONFINITE_POS_INF
from .checks import (HALF_FLOATS, check_contiguous, check_index_range, check_indices, check_no_nan, check_nonnegative,
                     check_same_dtype, check_same_length, check_sorted, check_values, check_vector, overlaps)

__all__ = ["topk", "topk_radix", "block_topk", "topk_accum_", "merge_add_many", "merge_add", "scatter_add_",
           "scatter_set_", "gather", "nonfinite_flags"]


def topk(x: torch.Tensor, k: int, op: str = "sparsecomm.topk") -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude, ties to the lower index, indices ascending."""
    check_vector(x, op, "x")
    check_nonnegative(k, op, "k")
    check_values(x, op, "x")
    check_no_nan(x, op)
    n = x.numel()
    if k >= n:
        return x.clone(), torch.arange(n, dtype=torch.int64, device=x.device)
    if k == 0:
        return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
    a = x.abs()  # +0.0 and -0.0 are equal, Inf is the largest
    thr = torch.topk(a, k, sorted=False).values.min()
    gt = a > thr
    eq = a == thr
    need = k - gt.sum()
    # the first `need` entries equal to the threshold: ties go to the lower index
    mask = gt | (eq & (torch.cumsum(eq.to(torch.int32 if n < 2**31 else torch.int64), 0) <= need))
    idx = mask.nonzero().squeeze(1)
    return x[idx], idx


def topk_radix(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return topk(x, k, "sparsecomm.topk_radix")


def block_topk(x: torch.Tensor, num_blocks: int, k_per_block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of every block [b n / B, (b+1) n / B): one stable sort by (block, -|x|, index)."""
    op = "sparsecomm.block_topk"
    check_vector(x, op, "x")
    if num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be >= 1, got {num_blocks}")
    check_nonnegative(k_per_block, op, "k_per_block")
    check_values(x, op, "x")
    check_no_nan(x, op)
    n = x.numel()
    if n == 0 or k_per_block == 0:
        return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
    pos = torch.arange(n, dtype=torch.int64, device=x.device)
    # block of element i: the largest b with b n // B <= i, i.e. ((i + 1) B - 1) // n
    block = ((pos + 1) * num_blocks - 1) // n
    # descending |x| with ties in index order, then (stably) by block
    order = torch.sort(x.abs(), descending=True, stable=True).indices
    order = order[torch.sort(block[order], stable=True).indices]
    sorted_block = block[order]
    first = torch.searchsorted(sorted_block, sorted_block, right=False)
    keep = order[(pos - first) < k_per_block]
    idx = keep.sort().values
    return x[idx], idx


def topk_accum_(acc: torch.Tensor, g: torch.Tensor, num_blocks: int, k_per_block: int, clear: bool,
                values: torch.Tensor, indices: torch.Tensor) -> None:
    """acc += g, then (block) top-k of the sums into values / indices; clear zeroes them in acc
    (the contract of sc_block_topk_accum: the same checks, the same bits)."""
    op = "sparsecomm.topk_accum_"
    for t, name in ((acc, "acc"), (g, "g"), (values, "values"), (indices, "indices")):
        check_vector(t, op, name)
    for t, name in ((acc, "acc"), (values, "values"), (indices, "indices")):
        check_contiguous(t, op, name)
    if num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be >= 1, got {num_blocks}")
    check_nonnegative(k_per_block, op, "k_per_block")
    check_values(acc, op, "acc", full=True)
    check_same_dtype(acc, g, op, "acc", "g")
    check_same_dtype(acc, values, op, "acc", "values")
    if indices.dtype != torch.int64:
        raise TypeError(f"{op}: indices must be int64, got {indices.dtype}")
    check_same_length(acc, g, op, "acc", "g")
    n = acc.numel()
    q, r = divmod(n, num_blocks)
    m = 0 if n == 0 or k_per_block == 0 else r * min(k_per_block, q + 1) + (num_blocks - r) * min(k_per_block, q)
    if values.numel() != m or indices.numel() != m:
        raise ValueError(f"{op}: values and indices must hold {m} entries (the block top-k count of N={n}, "
                         f"num_blocks={num_blocks}, k_per_block={k_per_block}), got {values.numel()} and "
                         f"{indices.numel()}")
    for t, name in ((g, "g"), (values, "values"), (indices, "indices")):
        if overlaps(acc, t):
            raise ValueError(f"{op}: acc and {name} share memory (acc is written while {name} is used)")
    if n == 0:
        return
    acc.add_(g)
    v, i = topk(acc, k_per_block, op) if num_blocks == 1 else block_topk(acc, num_blocks, k_per_block)
    values.copy_(v)
    indices.copy_(i)
    if clear:
        acc.index_fill_(0, i, 0)


def merge_add_many(indices: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                   n: Optional[int] = None, op: str = "sparsecomm.merge_add_many",
                   names: Optional[Sequence[str]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """k-way union, values summed in list order (half types in float32, rounded once)."""
    if len(indices) == 0:
        raise ValueError(f"{op}: needs at least one input vector, got none")
    if len(indices) != len(values):
        raise ValueError(f"{op}: indices and values must be lists of the same length, got "
                         f"{len(indices)} and {len(values)}")
    inames = list(names) if names else [f"indices[{p}]" for p in range(len(indices))]
    vnames = [s.replace("idx", "val").replace("indices", "values") for s in inames]
    for p, (i, v) in enumerate(zip(indices, values)):
        check_vector(i, op, inames[p])
        check_vector(v, op, vnames[p])
        check_indices(i, op, inames[p])
        check_values(v, op, vnames[p])
        if p:
            check_same_dtype(indices[0], i, op, inames[0], inames[p])
            check_same_dtype(values[0], v, op, vnames[0], vnames[p])
        check_same_length(i, v, op, inames[p], vnames[p])
    for p, i in enumerate(indices):
        check_sorted(op, i, inames[p], n)
    out_idx = torch.unique(torch.cat(list(indices)))  # sorted
    acc_dtype = torch.float32 if values[0].dtype in HALF_FLOATS else values[0].dtype
    # -0.0 is the identity of IEEE addition (+0.0 is not: 0.0 + -0.0 = +0.0), so an index
    # held by one input keeps its value's bits, as in the C merge
    acc = torch.full((out_idx.numel(),), -0.0, dtype=acc_dtype, device=out_idx.device)
    for i, v in zip(indices, values):  # one input after the other: the C kernel's order
        if i.numel():
            pos = torch.searchsorted(out_idx, i)
            acc[pos] = acc[pos] + v.to(acc_dtype)
    return out_idx.to(indices[0].dtype), acc.to(values[0].dtype)


def merge_add(idx_a, val_a, idx_b, val_b, n: int = -1):
    return merge_add_many([idx_a, idx_b], [val_a, val_b], None if n < 0 else n, "sparsecomm.merge_add",
                          ["idx_a", "idx_b"])


def _strictly_ascending(idx: torch.Tensor) -> bool:
    return idx.numel() < 2 or bool((idx[1:] > idx[:-1]).all())


def _check_scatter(op: str, dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> None:
    """What the C kernels check before a scatter writes anything (the same errors)."""
    check_vector(dense, op, "dense")
    check_vector(idx, op, "idx")
    check_vector(val, op, "val")
    check_contiguous(dense, op, "dense")
    check_values(dense, op, "dense")
    check_indices(idx, op, "idx")
    check_same_dtype(dense, val, op, "dense", "val")
    check_same_length(idx, val, op, "idx", "val")
    for t, name in ((val, "val"), (idx, "idx")):  # overlap first, as the C kernels
        if overlaps(dense, t.contiguous()):
            raise ValueError(f"{op}: {name} partially overlaps the tensor written in place; pass a copy")
    check_index_range(op, idx, dense.numel())


def scatter_add_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> None:
    """dense[idx] += val; half types: each addition in float32, rounded to the dense dtype.

    Strictly ascending (distinct) indices: one gather-add-write, the same bits on every
    device. Other orders (repeats): ``index_add_``, serial in input order on CPU (the C
    kernel's order), unspecified on CUDA.
    """
    _check_scatter("sparsecomm.scatter_add_", dense, idx, val)
    if idx.numel() == 0:
        return
    i64 = idx.to(torch.int64)
    if _strictly_ascending(i64):
        work = torch.float32 if dense.dtype in HALF_FLOATS else dense.dtype
        dense[i64] = (dense[i64].to(work) + val.to(work)).to(dense.dtype)
    else:
        dense.index_add_(0, i64, val)


def scatter_set_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, zero_rest: bool = False) -> None:
    """dense[idx] = val (a repeated index keeps its last value in input order, on every
    device: the last of each run of a stable sort); zero_rest: every other entry 0."""
    _check_scatter("sparsecomm.scatter_set_", dense, idx, val)
    if zero_rest:
        dense.zero_()
    if idx.numel() == 0:
        return
    i64 = idx.to(torch.int64)
    if not _strictly_ascending(i64):
        i64, order = torch.sort(i64, stable=True)
        last = torch.ones_like(i64, dtype=torch.bool)
        last[:-1] = i64[1:] != i64[:-1]
        i64, val = i64[last], val[order[last]]
    dense[i64] = val


def gather(dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    op = "sparsecomm.gather"
    check_vector(dense, op, "dense")
    check_vector(idx, op, "idx")
    check_values(dense, op, "dense")
    check_indices(idx, op, "idx")
    check_index_range(op, idx, dense.numel())
    return dense[idx.to(torch.int64)]


def nonfinite_flags(x: torch.Tensor) -> torch.Tensor:
    """NaN | +Inf | -Inf bits (``sparsecomm.ops.NONFINITE_*``) of what x holds, as a 0-dim int32 tensor on x's device:
    one aminmax (a NaN propagates to both ends, an Inf shows as an end), then, only when
    an end is not finite, one read per kind."""
    op = "sparsecomm.nonfinite_flags"
    check_values(x, op, "x")
    flags = torch.zeros((), dtype=torch.int32, device=x.device)
    if x.numel() == 0:
        return flags
    ends = torch.stack(torch.aminmax(x.reshape(-1)))
    if bool(torch.isfinite(ends).all()):
        return flags
    for bit, test in ((NONFINITE_NAN, torch.isnan), (NONFINITE_POS_INF, torch.isposinf),
                      (NONFINITE_NEG_INF, torch.isneginf)):
        flags += bit * test(x).any().to(torch.int32)
    return flags
