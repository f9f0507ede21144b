"""Selection and sparse-vector kernels (the hot path of every algorithm).

CPU tensors run the C kernels of ``csrc/cpu`` (multi-threaded with OpenMP, using
``torch.get_num_threads()`` threads) through the ``torch.ops.sparsecomm``
operators registered by the extension module ``sparsecomm._C``. Tensors on any
other device (e.g. CUDA, until CUDA kernels exist) use equivalent pure-torch
implementations with the same semantics; they are correct but not tuned.

Conventions shared by all functions:

* Top-k is by magnitude ``|x|``. Ties in ``|x|`` are broken by the lower index
  (``+0.0`` and ``-0.0`` are equal), ``Inf`` is the largest magnitude, and an
  input containing NaN raises ``ValueError``. Indices are int64 and ascending,
  values are ``x[indices]`` with their original sign.
* COO vectors are pairs ``(idx, val)`` of 1-D tensors of the same length;
  ``idx`` is int32 or int64, strictly ascending (sorted, no duplicates);
  ``val`` is float32, float64, float16 or bfloat16. All vectors passed to one
  call share the index dtype and the value dtype.
* float16 / bfloat16 sums are accumulated in float32 and rounded once
  (round-to-nearest-even) to the value dtype. Summation order is fixed (input
  order), so results are bit-identical for identical inputs on every rank.
* Errors: bad shapes, values, orders or ranges raise ``ValueError``; bad dtypes
  raise ``TypeError``.
"""
from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Tuple

import torch

from . import _C  # noqa: F401  (registers torch.ops.sparsecomm.*)

__all__ = [
    "topk",
    "block_topk",
    "merge_add",
    "merge_add_many",
    "scatter_add_",
    "gather",
]

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)

_ops = torch.ops.sparsecomm


def _as_int(v, name: str, op: str) -> int:
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}") from None


def _check_1d(t: torch.Tensor, name: str, op: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(
            f"{op}: {name} must be a 1-D tensor, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")


def _check_float(t: torch.Tensor, name: str, op: str) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float64, float16 or bfloat16, got {t.dtype}")


# --------------------------------------------------------------------- top-k

def topk(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` entries of the 1-D tensor ``x`` by magnitude ``|x|``.

    Returns ``(values, indices)`` with ``m = min(k, len(x))`` entries:
    ``indices`` is int64 in ascending order and ``values = x[indices]`` (same
    dtype as ``x``, original sign). Ties in ``|x|`` are broken by the lower
    index, so the result is deterministic; ``+0.0`` and ``-0.0`` are equal and
    ``Inf`` counts as the largest magnitude. ``k = 0`` gives empty tensors,
    ``k >= len(x)`` gives every element.

    Raises ``ValueError`` if ``x`` is not 1-D, ``k < 0``, or ``x`` contains
    NaN; ``TypeError`` for dtypes other than float32/float64/float16/bfloat16.

    CPU: multi-threaded C kernel (sampled threshold + one filtering pass, with
    an exact radix fallback), typically >10x faster than
    ``torch.topk(x.abs(), k)``. Other devices: a torch implementation
    (``torch.topk`` on ``|x|``, then the exact tie rule and sorted indices).
    """
    op = "sparsecomm.topk"
    _check_1d(x, "x", op)
    k = _as_int(k, "k", op)
    if k < 0:
        raise ValueError(f"{op}: k must be >= 0, got {k}")
    _check_float(x, "x", op)
    if x.device.type == "cpu":
        return _ops.topk(x, k)
    return _topk_torch(x, k)


def block_topk(x: torch.Tensor, num_blocks: int,
               k_per_block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-``k_per_block`` by magnitude inside each of ``num_blocks`` blocks.

    Block ``b`` is ``x[b*N//B : (b+1)*N//B]`` (``N = len(x)``,
    ``B = num_blocks``; blocks differ in length by at most one when ``B`` does
    not divide ``N``). Each block contributes ``min(k_per_block, block_len)``
    entries, selected with the rules of :func:`topk`; the result is the
    concatenation in block order, so the global int64 ``indices`` are
    ascending. ``num_blocks > N`` is allowed (empty blocks contribute nothing).

    One call handles all blocks (CPU: blocks run in parallel, or each block
    multi-threaded when blocks are large). Other devices: torch fallback.
    Raises ``ValueError`` for ``num_blocks < 1``, ``k_per_block < 0``, non-1-D
    ``x`` or NaN.
    """
    op = "sparsecomm.block_topk"
    _check_1d(x, "x", op)
    num_blocks = _as_int(num_blocks, "num_blocks", op)
    k_per_block = _as_int(k_per_block, "k_per_block", op)
    if num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be >= 1, got {num_blocks}")
    if k_per_block < 0:
        raise ValueError(f"{op}: k_per_block must be >= 0, got {k_per_block}")
    _check_float(x, "x", op)
    if x.device.type == "cpu":
        return _ops.block_topk(x, num_blocks, k_per_block)
    n = x.numel()
    vals: List[torch.Tensor] = []
    idxs: List[torch.Tensor] = []
    _check_no_nan(x, op)
    for b in range(num_blocks):
        lo, hi = b * n // num_blocks, (b + 1) * n // num_blocks
        if hi > lo:
            v, i = _topk_torch(x[lo:hi], k_per_block)
            vals.append(v)
            idxs.append(i + lo)
    if not vals:
        return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
    return torch.cat(vals), torch.cat(idxs)


def _check_no_nan(x: torch.Tensor, op: str) -> None:
    if x.numel() and bool(torch.isnan(x).any()):
        raise ValueError(f"{op}: input contains NaN; top-k by magnitude is undefined for NaN "
                         "(clean or mask the tensor first)")


def _topk_torch(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Device-agnostic top-k with the exact tie rule (reference for non-CPU)."""
    _check_no_nan(x, "sparsecomm.topk")
    n = x.numel()
    if k >= n:
        return x.clone(), torch.arange(n, dtype=torch.int64, device=x.device)
    if k == 0:
        return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
    a = x.abs()
    thr = torch.topk(a, k, sorted=False).values.min()
    gt = a > thr
    eq = a == thr
    need = k - gt.sum()
    mask = gt | (eq & (torch.cumsum(eq.to(torch.int64), 0) <= need))
    idx = mask.nonzero().squeeze(1)
    return x[idx], idx


# ----------------------------------------------------------------------- COO

def _check_coo(op: str, idx: Sequence[torch.Tensor], val: Sequence[torch.Tensor],
               inames: Sequence[str], vnames: Sequence[str], n: Optional[int]) -> None:
    if len(idx) != len(val):
        raise ValueError(f"{op}: indices and values must be lists of the same length, "
                         f"got {len(idx)} and {len(val)}")
    if len(idx) == 0:
        raise ValueError(f"{op}: needs at least one input vector, got none")
    for i, v, iname, vname in zip(idx, val, inames, vnames):
        _check_1d(i, iname, op)
        _check_1d(v, vname, op)
        if i.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{op}: {iname} must be int32 or int64, got {i.dtype}")
        _check_float(v, vname, op)
        if i.dtype != idx[0].dtype:
            raise TypeError(f"{op}: all index vectors must share one dtype, but {inames[0]} is "
                            f"{idx[0].dtype} and {iname} is {i.dtype}")
        if v.dtype != val[0].dtype:
            raise TypeError(f"{op}: all value vectors must share one dtype, but {vnames[0]} is "
                            f"{val[0].dtype} and {vname} is {v.dtype}")
        if i.numel() != v.numel():
            raise ValueError(f"{op}: {iname} and {vname} must have the same length, "
                             f"got {i.numel()} and {v.numel()}")


def _check_sorted_torch(op: str, i: torch.Tensor, name: str, n: Optional[int]) -> None:
    if i.numel() == 0:
        return
    if bool((i[1:] <= i[:-1]).any()):
        p = int((i[1:] <= i[:-1]).nonzero()[0]) + 1
        raise ValueError(f"{op}: {name} must be strictly ascending (sorted, no duplicates), but "
                         f"{name}[{p}] = {int(i[p])} is not greater than {name}[{p - 1}]")
    if int(i[0]) < 0:
        raise ValueError(f"{op}: {name} must hold indices >= 0, but {name}[0] = {int(i[0])}")
    if n is not None and n >= 0 and int(i[-1]) >= n:
        raise ValueError(f"{op}: {name} must hold indices < {n}, but "
                         f"{name}[{i.numel() - 1}] = {int(i[-1])}")


def _merge_torch(op: str, idx: Sequence[torch.Tensor], val: Sequence[torch.Tensor],
                 names: Sequence[str], n: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    for i, name in zip(idx, names):
        _check_sorted_torch(op, i, name, n)
    out_idx = torch.unique(torch.cat(list(idx)))  # sorted
    acc_dtype = torch.float32 if val[0].dtype in (torch.float16, torch.bfloat16) else val[0].dtype
    acc = torch.zeros(out_idx.numel(), dtype=acc_dtype, device=out_idx.device)
    # inputs are added one after the other (list order): deterministic
    for i, v in zip(idx, val):
        if i.numel():
            pos = torch.searchsorted(out_idx, i)
            acc[pos] = acc[pos] + v.to(acc_dtype)
    return out_idx.to(idx[0].dtype), acc.to(val[0].dtype)


def merge_add(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
              val_b: torch.Tensor, n: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Union of two index-sorted COO vectors, summing values on shared indices.

    Returns ``(idx, val)``: ``idx`` is the sorted union of ``idx_a`` and
    ``idx_b`` (same index dtype), ``val`` holds ``val_a + val_b`` where an
    index is in both, else the single value. Half types are summed in float32
    and rounded once. ``n`` (optional) is the dense length: indices must then
    be ``< n``. Indices must be strictly ascending and ``>= 0`` (checked;
    ``ValueError`` otherwise). Non-CPU tensors: torch fallback (cat/unique/
    searchsorted), same results.
    """
    op = "sparsecomm.merge_add"
    _check_coo(op, [idx_a, idx_b], [val_a, val_b], ["idx_a", "idx_b"], ["val_a", "val_b"], n)
    nn = -1 if n is None else _as_int(n, "n", op)
    if all(t.device.type == "cpu" for t in (idx_a, val_a, idx_b, val_b)):
        return _ops.merge_add(idx_a, val_a, idx_b, val_b, nn)
    return _merge_torch(op, [idx_a, idx_b], [val_a, val_b], ["idx_a", "idx_b"], n)


def merge_add_many(indices: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                   n: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """k-way union of index-sorted COO vectors ``(indices[p], values[p])``.

    Where several inputs hold the same index their values are summed in list
    order (input 0 first; half types in float32, rounded once), so every rank
    that passes the same inputs in the same order gets bit-identical results.
    O(total * log P) on CPU (heap merge, parallel over index ranges). At least
    one input is required. ``n`` (optional): indices must be ``< n``.
    Non-CPU tensors: torch fallback with the same summation order.
    """
    op = "sparsecomm.merge_add_many"
    indices = list(indices)
    values = list(values)
    inames = [f"indices[{i}]" for i in range(len(indices))]
    vnames = [f"values[{i}]" for i in range(len(values))]
    _check_coo(op, indices, values, inames, vnames, n)
    nn = -1 if n is None else _as_int(n, "n", op)
    if all(t.device.type == "cpu" for t in indices + values):
        return _ops.merge_add_many(indices, values, nn)
    return _merge_torch(op, indices, values, inames, n)


def _check_index_vec(op: str, idx: torch.Tensor, dense: torch.Tensor) -> None:
    _check_1d(idx, "idx", op)
    if idx.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: idx must be int32 or int64, got {idx.dtype}")
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0:
            raise ValueError(f"{op}: idx must hold indices >= 0, got {lo}")
        if hi >= dense.numel():
            raise ValueError(f"{op}: idx must hold indices < {dense.numel()}, got {hi}")


def scatter_add_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """In place ``dense[idx] += val`` for a 1-D ``dense``; returns ``dense``.

    ``idx`` (int32/int64, any order) may repeat: repeated indices add up, in
    order. Half types: each addition is computed in float32 and rounded to the
    dense dtype. Indices must lie in ``[0, len(dense))`` (checked before
    anything is written; ``ValueError`` otherwise). Non-CPU tensors:
    ``Tensor.index_add_`` (on CUDA the order of repeated indices is not fixed).
    """
    op = "sparsecomm.scatter_add_"
    _check_1d(dense, "dense", op)
    _check_1d(idx, "idx", op)
    _check_1d(val, "val", op)
    _check_float(dense, "dense", op)
    if all(t.device.type == "cpu" for t in (dense, idx, val)):
        return _ops.scatter_add_(dense, idx, val)
    if val.dtype != dense.dtype:
        raise TypeError(f"{op}: val must have the dtype of dense ({dense.dtype}), got {val.dtype}")
    if idx.numel() != val.numel():
        raise ValueError(f"{op}: idx and val must have the same length, got "
                         f"{idx.numel()} and {val.numel()}")
    _check_index_vec(op, idx, dense)
    return dense.index_add_(0, idx.to(torch.int64), val)


def gather(dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``dense[idx]`` for a 1-D ``dense`` and int32/int64 ``idx`` (checked range).

    Non-CPU tensors: plain torch indexing.
    """
    op = "sparsecomm.gather"
    _check_1d(dense, "dense", op)
    _check_1d(idx, "idx", op)
    _check_float(dense, "dense", op)
    if dense.device.type == "cpu" and idx.device.type == "cpu":
        return _ops.gather(dense, idx)
    _check_index_vec(op, idx, dense)
    return dense[idx.to(torch.int64)]

from ._sketch_ops import *  # noqa: E402,F401,F403  (Count-Sketch ops, issue 5)
from . import _sketch_ops  # noqa: E402
__all__ += _sketch_ops.__all__  # noqa: E402
from ._stream_ops import *  # noqa: E402,F401,F403  (sparse-stream ops, issue 4)
from . import _stream_ops  # noqa: E402
__all__ += _stream_ops.__all__  # noqa: E402
