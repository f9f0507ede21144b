"""Torch implementations of the ops, for devices without C kernels (CUDA until
``csrc/cuda`` lands): the same contracts as the C kernels (tie rule, summation order,
validation, errors), written with plain torch so they run on any device. Correct, not
tuned. Registered for the CUDA dispatch key by :func:`register`; tests run them on CPU
tensors directly against the same references as the C kernels.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["topk", "block_topk", "merge_add_many", "scatter_add_", "gather", "stream_add_dd_",
           "stream_concat", "qsgd_quantize", "qsgd_dequantize", "sketch_build_coo_",
           "sketch_build_", "sketch_estimate_at", "sketch_estimate", "densestream_encode_coo",
           "densestream_encode_dense", "densestream_add", "densestream_slice", "densestream_add_into_",
           "densestream_to_coo", "register", "RUN"]

RUN = 16  # coordinates per run of the Count-Sketch hash family (SC_SKETCH_RUN in sketch.h)
_MASK = (1 << 64) - 1


def _check_no_nan(x: torch.Tensor, op: str) -> None:
    if x.numel() and bool(torch.isnan(x).any()):
        raise ValueError(f"{op}: x contains NaN; top-k by magnitude is undefined for NaN "
                         "(clean or mask the tensor first)")


def topk(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude, ties to the lower index, indices ascending."""
    _check_no_nan(x, "sparsecomm.topk")
    if k < 0:
        raise ValueError(f"sparsecomm.topk: k must be >= 0, got {k}")
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


def block_topk(x: torch.Tensor, num_blocks: int, k_per_block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    if num_blocks < 1:
        raise ValueError(f"sparsecomm.block_topk: num_blocks must be >= 1, got {num_blocks}")
    if k_per_block < 0:
        raise ValueError(f"sparsecomm.block_topk: k_per_block must be >= 0, got {k_per_block}")
    _check_no_nan(x, "sparsecomm.block_topk")
    n = x.numel()
    if num_blocks >= n:  # at most one element per block
        if k_per_block == 0:
            return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
        return x.clone(), torch.arange(n, dtype=torch.int64, device=x.device)
    vals: List[torch.Tensor] = []
    idxs: List[torch.Tensor] = []
    for b in range(num_blocks):
        lo, hi = b * n // num_blocks, (b + 1) * n // num_blocks
        if hi > lo:
            v, i = topk(x[lo:hi], k_per_block)
            vals.append(v)
            idxs.append(i + lo)
    if not vals:
        return x.new_empty(0), torch.empty(0, dtype=torch.int64, device=x.device)
    return torch.cat(vals), torch.cat(idxs)


def _check_sorted(op: str, i: torch.Tensor, name: str, n: Optional[int]) -> None:
    """Strictly ascending and inside [0, n) in full (the C kernels' fused check)."""
    if i.numel() == 0:
        return
    bad_order = (i[1:] <= i[:-1]).nonzero()
    bad_range = ((i < 0) | (i >= n if n is not None and n >= 0 else torch.zeros_like(i, dtype=torch.bool))).nonzero()
    first_order = int(bad_order[0]) + 1 if bad_order.numel() else None
    first_range = int(bad_range[0]) if bad_range.numel() else None
    if first_order is not None and (first_range is None or first_order < first_range):
        raise ValueError(f"{op}: {name} must be strictly ascending (sorted, no duplicates), but "
                         f"{name}[{first_order}] = {int(i[first_order])} does not follow the entry before it")
    if first_range is not None:
        v = int(i[first_range])
        bound = ">= 0" if v < 0 else f"< {n}"
        raise ValueError(f"{op}: {name} must hold indices {bound}, but {name}[{first_range}] = {v}")


def merge_add_many(indices: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                   n: Optional[int] = None, op: str = "sparsecomm.merge_add_many"
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """k-way union, values summed in list order (half types in float32, rounded once)."""
    if len(indices) == 0 or len(indices) != len(values):
        raise ValueError(f"{op}: needs one value vector per index vector and at least one, got "
                         f"{len(indices)} and {len(values)}")
    for p, (i, v) in enumerate(zip(indices, values)):
        if i.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: indices[{p}] must be int32 or int64, got {i.dtype}")
        if i.dtype != indices[0].dtype or v.dtype != values[0].dtype:
            raise TypeError(f"{op}: all index vectors must share one dtype and all value vectors one dtype")
        if i.numel() != v.numel():
            raise ValueError(f"{op}: indices[{p}] and values[{p}] must have the same length, "
                             f"got {i.numel()} and {v.numel()}")
        _check_sorted(op, i, f"indices[{p}]", n)
    out_idx = torch.unique(torch.cat(list(indices)))  # sorted
    acc_dtype = torch.float32 if values[0].dtype in (torch.float16, torch.bfloat16) else values[0].dtype
    acc = torch.zeros(out_idx.numel(), dtype=acc_dtype, device=out_idx.device)
    for i, v in zip(indices, values):  # one input after the other: deterministic order
        if i.numel():
            pos = torch.searchsorted(out_idx, i)
            acc[pos] = acc[pos] + v.to(acc_dtype)
    return out_idx.to(indices[0].dtype), acc.to(values[0].dtype)


def merge_add(idx_a, val_a, idx_b, val_b, n: int = -1):
    return merge_add_many([idx_a, idx_b], [val_a, val_b], None if n < 0 else n, "sparsecomm.merge_add")


def _check_index_range(op: str, idx: torch.Tensor, limit: int) -> None:
    if idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: idx must be int32 or int64, got {idx.dtype}")
    if idx.numel():
        bad = ((idx < 0) | (idx >= limit)).nonzero()
        if bad.numel():
            p = int(bad[0])
            v = int(idx[p])
            bound = ">= 0" if v < 0 else f"< {limit}"
            raise ValueError(f"{op}: idx must hold indices {bound}, but idx[{p}] = {v}")


def scatter_add_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> None:
    """dense[idx] += val; repeats add up (on CUDA in an unspecified order)."""
    op = "sparsecomm.scatter_add_"
    if val.dtype != dense.dtype:
        raise TypeError(f"{op}: val must have the dtype of dense ({dense.dtype}), got {val.dtype}")
    if idx.numel() != val.numel():
        raise ValueError(f"{op}: idx and val must have the same length, got {idx.numel()} and {val.numel()}")
    _check_index_range(op, idx, dense.numel())
    if dense.dtype in (torch.float16, torch.bfloat16):
        acc = dense.float()
        acc.index_add_(0, idx.to(torch.int64), val.float())
        dense.copy_(acc)
    else:
        dense.index_add_(0, idx.to(torch.int64), val)


def gather(dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    _check_index_range("sparsecomm.gather", idx, dense.numel())
    return dense[idx.to(torch.int64)]


def stream_add_dd_(a: torch.Tensor, b: torch.Tensor) -> None:
    a.add_(b)


def stream_concat(idx_a, val_a, idx_b, val_b):
    idx = torch.cat([idx_a, idx_b])
    _check_sorted("sparsecomm.stream_concat", idx, "cat(idx_a, idx_b)", None)
    return idx, torch.cat([val_a, val_b])


def qsgd_quantize(x: torch.Tensor, bits: int, bucket_size: int, seed: int):
    """Same layout as the C kernel; torch's generator (not bit-identical to it)."""
    if bool(torch.isnan(x).any()):
        raise ValueError("sparsecomm.qsgd_quantize: x contains NaN")
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


def qsgd_dequantize(packed, scales, n: int, bits: int, bucket_size: int, dtype: torch.dtype):
    s = (1 << (bits - 1)) - 1
    if bits == 8:
        q = packed[:n].to(torch.int64)
    else:
        q = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1).to(torch.int64)
        if n % 2 and int(q[n]) != 0:
            raise ValueError("malformed message: sparsecomm.qsgd_dequantize: packed has a non-zero unused nibble")
        q = q[:n]
    if q.numel() and int(q.max()) > 2 * s:
        raise ValueError(f"malformed message: sparsecomm.qsgd_dequantize: packed holds a level above {2 * s}")
    if scales.numel() and not bool((torch.isfinite(scales) & (scales >= 0)).all()):
        raise ValueError("malformed message: sparsecomm.qsgd_dequantize: scales must be finite and >= 0")
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    return ((q - s).double() * sc / s).to(dtype)


# ------------------------------------------------------------ Count-Sketch

def _mix(z: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic wraps like uint64; logical shifts need masking after arithmetic >>
    z = z ^ ((z >> 30) & ((1 << 34) - 1))
    z = z * _signed(0xBF58476D1CE4E5B9)
    z = z ^ ((z >> 27) & ((1 << 37) - 1))
    z = z * _signed(0x94D049BB133111EB)
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _signed(u: int) -> int:
    u &= _MASK
    return u - (1 << 64) if u >= 1 << 63 else u


def _row_keys(rows: int, seed: int, device) -> torch.Tensor:
    base = torch.tensor([_signed((seed & _MASK) + 0x9E3779B97F4A7C15 * (j + 1)) for j in range(rows)],
                        dtype=torch.int64, device=device)
    return _mix(base)


def _hashes(table: torch.Tensor, idx: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    rows, cols = table.shape
    off = idx & (RUN - 1)
    h = _mix(_row_keys(rows, seed, table.device)[:, None] ^ (idx // RUN)[None, :])
    hi = (h >> 32) & 0xFFFFFFFF
    first = (hi * cols) >> 32 if cols < 2**31 else ((hi.double() * cols) / 2**32).floor().long()
    bucket = (first + off[None, :]) % cols
    sign = 1 - 2 * ((h >> off[None, :]) & 1)
    return bucket, sign


def sketch_build_coo_(table: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, n: int, seed: int) -> None:
    _check_index_range("sparsecomm.sketch_build_coo_", idx, n)
    idx = idx.to(torch.int64)
    bucket, sign = _hashes(table, idx, seed)
    for j in range(table.shape[0]):
        table[j].index_add_(0, bucket[j], sign[j].to(table.dtype) * val.to(table.dtype))


def sketch_build_(table: torch.Tensor, x: torch.Tensor, seed: int) -> None:
    nz = torch.nonzero(x).squeeze(1)
    sketch_build_coo_(table, nz, x[nz], x.numel(), seed)


def sketch_estimate_at(table: torch.Tensor, idx: torch.Tensor, seed: int) -> torch.Tensor:
    idx = idx.to(torch.int64)
    if idx.numel() and int(idx.min()) < 0:
        raise ValueError("sparsecomm.sketch_estimate_at: idx must hold indices >= 0")
    bucket, sign = _hashes(table, idx, seed)
    est = torch.gather(table, 1, bucket) * sign.to(table.dtype)
    rows = table.shape[0]
    s = est.sort(dim=0).values
    if rows % 2:
        return s[rows // 2].contiguous()
    return ((s[rows // 2 - 1] + s[rows // 2]) / 2).contiguous()


def sketch_estimate(table: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    return sketch_estimate_at(table, torch.arange(n, device=table.device), seed)


# -- DenseStream (csrc/include/sparsecomm/densestream.h): through an N-sized dense buffer

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
    _check_sorted("sparsecomm.densestream_encode_coo", idx, "idx", n)
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


def _no_return(fn):
    def op(*args):
        fn(*args)
    return op


def register(device: str = "cuda") -> None:
    """Registers these implementations as the ``device`` kernels of the sparsecomm ops."""
    impls = {
        "topk": topk, "topk_radix": topk, "block_topk": block_topk, "merge_add": merge_add,
        "merge_add_many": lambda i, v, n=-1: merge_add_many(i, v, None if n < 0 else n),
        "scatter_add_": _no_return(scatter_add_), "gather": gather,
        "stream_add_dd_": _no_return(stream_add_dd_), "stream_concat": stream_concat,
        "qsgd_quantize": qsgd_quantize, "qsgd_dequantize": qsgd_dequantize,
        "sketch_build_": _no_return(sketch_build_), "sketch_build_coo_": _no_return(sketch_build_coo_),
        "sketch_estimate": sketch_estimate, "sketch_estimate_at": sketch_estimate_at,
        "densestream_encode_coo": densestream_encode_coo, "densestream_encode_dense": densestream_encode_dense,
        "densestream_add": densestream_add, "densestream_slice": densestream_slice,
        "densestream_add_into_": _no_return(densestream_add_into_), "densestream_to_coo": densestream_to_coo,
    }
    for name, fn in impls.items():
        torch.library.register_kernel(f"sparsecomm::{name}", device, fn)
