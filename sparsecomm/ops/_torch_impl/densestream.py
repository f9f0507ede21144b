"""DenseStream blocks in torch (``csrc/include/sparsecomm/densestream.h``): encode, add,
slice and decode through an N-sized dense buffer (correct, not tuned)."""

from __future__ import annotations

import torch

from .checks import check_sorted

__all__ = ["densestream_encode_dense", "densestream_encode_coo", "densestream_add", "densestream_slice",
           "densestream_add_into_", "densestream_to_coo"]


def _ds_width(n: int, width: int) -> int:
    if not 0 <= width <= 8:
        raise ValueError(f"sparsecomm.densestream: width must be 1..8 bytes, or 0 for the fewest that hold n - 1, "
                         f"got {width}")
    return width or max(1, (max(n - 1, 0).bit_length() + 7) // 8)


def _ds_check_blocks(op: str, starts: torch.Tensor, lengths: torch.Tensor, nvalues: int, n: int) -> None:
    if starts.numel() == 0:
        if nvalues:
            raise ValueError(f"{op}: the lengths sum to 0, values has {nvalues}")
        return
    ends = starts + lengths
    bad_start = (starts < 0) | (starts >= n)
    bad_order = torch.zeros_like(bad_start)
    bad_order[1:] = starts[1:] < ends[:-1]
    bad_len = (lengths < 1) | (lengths > n - starts)
    if bool((bad_start | bad_order | bad_len).any()):
        b = int((bad_start | bad_order | bad_len).nonzero()[0])
        what = ("starts must hold indices in [0, n)" if bad_start[b] else
                "starts must be strictly ascending (a block may not begin before the previous one ends)"
                if bad_order[b] else "lengths must be >= 1 and keep every block inside [0, n)")
        raise ValueError(f"{op}: {what}, but block [{b}] has start {int(starts[b])}, length {int(lengths[b])}")
    if int(lengths.sum()) != nvalues:
        raise ValueError(f"{op}: the lengths sum to {int(lengths.sum())}, values has {nvalues}")


def _ds_positions(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Every position the blocks hold, ascending."""
    total = int(lengths.sum()) if lengths.numel() else 0
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts, lengths) + torch.arange(total, device=starts.device) - \
        torch.repeat_interleave(offsets, lengths)


def _ds_dense(starts, lengths, values, n: int) -> torch.Tensor:
    dense = torch.zeros(n, dtype=values.dtype, device=values.device)
    dense[_ds_positions(starts, lengths)] = values
    return dense


def densestream_encode_dense(x: torch.Tensor, width: int):
    n = x.numel()
    w = _ds_width(n, width)
    t = -(-2 * w // x.element_size())  # the zero-run rule: ceil(2 width / K)
    nz = (x != 0).nonzero().reshape(-1)
    if nz.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return empty, empty.clone(), x.new_empty(0)
    new = torch.ones_like(nz, dtype=torch.bool)
    new[1:] = nz[1:] - nz[:-1] - 1 > t
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    starts, lengths = nz[new], nz[last] + 1 - nz[new]
    values = x[_ds_positions(starts, lengths)]
    return starts, lengths, torch.where(values == 0, torch.zeros_like(values), values)


def densestream_encode_coo(idx: torch.Tensor, val: torch.Tensor, n: int, width: int):
    check_sorted("sparsecomm.densestream_encode_coo", idx, "idx", n)
    dense = torch.zeros(n, dtype=val.dtype, device=val.device)
    dense[idx.long()] = val
    return densestream_encode_dense(dense, _ds_width(n, width))


def _ds_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype in (torch.float16, torch.bfloat16):
        return (a.float() + b.float()).to(a.dtype)  # float32, rounded once
    return a + b


def densestream_add(sa, la, va, sb, lb, vb, n: int, width: int):
    _ds_check_blocks("sparsecomm.densestream_add", sa, la, va.numel(), n)
    _ds_check_blocks("sparsecomm.densestream_add", sb, lb, vb.numel(), n)
    return densestream_encode_dense(_ds_sum(_ds_dense(sa, la, va, n), _ds_dense(sb, lb, vb, n)), _ds_width(n, width))


def densestream_slice(starts, lengths, values, n: int, lo: int, hi: int, width: int):
    if not 0 <= lo <= hi <= n:
        raise ValueError(f"sparsecomm.densestream_slice: the range [lo, hi) must satisfy 0 <= lo <= hi <= n = {n}, "
                         f"got [{lo}, {hi})")
    _ds_check_blocks("sparsecomm.densestream_slice", starts, lengths, values.numel(), n)
    dense = _ds_dense(starts, lengths, values, n)
    dense[:lo] = 0
    dense[hi:] = 0
    return densestream_encode_dense(dense, _ds_width(n, width))


def densestream_add_into_(dense: torch.Tensor, starts, lengths, values) -> None:
    _ds_check_blocks("sparsecomm.densestream_add_into_", starts, lengths, values.numel(), dense.numel())
    pos = _ds_positions(starts, lengths)
    dense[pos] = _ds_sum(dense[pos], values)


def densestream_to_coo(starts, lengths, values, n: int):
    _ds_check_blocks("sparsecomm.densestream_to_coo", starts, lengths, values.numel(), n)
    pos = _ds_positions(starts, lengths)
    keep = values != 0
    return pos[keep], values[keep]
