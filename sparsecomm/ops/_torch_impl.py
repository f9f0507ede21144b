"""Torch implementations of the ops, for devices without C kernels: the same contracts as
the C kernels and their bindings (argument checks, tie rule, summation order, validation,
error types), written with plain torch so they run on any device. Correct, not tuned.

They are registered for the CUDA dispatch key by :func:`register` unless the extension
was built with the CUDA kernels of ``csrc/cuda`` (``SPARSECOMM_CUDA_KERNELS=1``), and for
CPU tensors too while the fallback switch is on (``SPARSECOMM_OPS=torch`` or
:func:`sparsecomm.ops.use_torch_ops`), so the code a GPU user runs without CUDA kernels is
tested on every machine: ``tests/test_torch_fallback.py`` compares every op with the C
kernel bit for bit and runs every algorithm through it.

Bit-identical to the C kernels on every device: top-k and block top-k, merges (sums in
list order, half types in float32 rounded once), gathers, scatters with distinct indices,
concatenation, QSGD (the same splitmix64 draws), dequantization, sketch hashing and
estimates (up to the sign of a zero estimate, which a median may pick either way).
Scatters with repeated indices and sketch builds use ``index_add_``: serial in input order
on CPU (so equal to the C kernels), in an unspecified order on CUDA (float sums may then
differ in the last bits between runs; gs-SGD broadcasts the root's sum, so ranks still agree).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["topk", "block_topk", "topk_accum_", "merge_add", "merge_add_many", "scatter_add_", "scatter_set_",
           "gather", "nonfinite_flags", "stream_add_dd_",
           "stream_concat", "qsgd_quantize", "qsgd_dequantize", "sketch_build_coo_", "sketch_build_",
           "sketch_estimate_at", "sketch_estimate", "densestream_encode_coo", "densestream_encode_dense",
           "densestream_add", "densestream_slice", "densestream_add_into_", "densestream_to_coo", "impls",
           "register", "RUN"]

RUN = 16  # coordinates per run of the Count-Sketch hash family (SC_SKETCH_RUN in sketch.h)
MAX_ROWS = 64  # SC_SKETCH_MAX_ROWS
_MASK = (1 << 64) - 1
_FLT_MAX = 3.4028234663852886e38
_HALF = (torch.float16, torch.bfloat16)
_ALL_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_FULL_FLOATS = (torch.float32, torch.float64)
WIRE_PREFIX = "malformed message: "  # ops/_errors.py (imported lazily there: no cycle)


# ------------------------------------------------------------ argument checks (csrc/checks.h)

def _vector(t: torch.Tensor, op: str, name: str) -> None:
    if t.dim() != 1:
        raise ValueError(f"{op}: {name} must be a 1-D tensor, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")


def _values(t: torch.Tensor, op: str, name: str, full: bool = False) -> None:
    allowed = _FULL_FLOATS if full else _ALL_FLOATS
    if t.dtype not in allowed:
        words = "float32 or float64" if full else "float32, float64, float16 or bfloat16"
        raise TypeError(f"{op}: {name} must be {words}, got {t.dtype}")


def _indices(t: torch.Tensor, op: str, name: str) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")


def _same_dtype(a: torch.Tensor, b: torch.Tensor, op: str, an: str, bn: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {bn} must have the dtype of {an} ({a.dtype}), got {b.dtype}")


def _same_length(a: torch.Tensor, b: torch.Tensor, op: str, an: str, bn: str) -> None:
    if a.numel() != b.numel():
        raise ValueError(f"{op}: {an} and {bn} must have the same length, got {a.numel()} and {b.numel()}")


def _nonnegative(v: int, op: str, name: str) -> None:
    if v < 0:
        raise ValueError(f"{op}: {name} must be >= 0, got {v}")


def _contiguous(t: torch.Tensor, op: str, name: str) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (it is written in place)")


def _byte_range(t: torch.Tensor) -> Tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the bytes of two (contiguous) tensors share anything?"""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def _first(mask: torch.Tensor) -> Optional[int]:
    """Position of the first True, or None (one host synchronisation)."""
    hit = mask.nonzero()
    return int(hit[0]) if hit.numel() else None


def _check_no_nan(x: torch.Tensor, op: str, name: str = "x") -> None:
    if x.numel():
        p = _first(torch.isnan(x))
        if p is not None:
            raise ValueError(f"{op}: {name}[{p}] is NaN: top-k by magnitude is undefined for NaN "
                             "(clean or mask the tensor first)")


# ------------------------------------------------------------ top-k

def topk(x: torch.Tensor, k: int, op: str = "sparsecomm.topk") -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude, ties to the lower index, indices ascending."""
    _vector(x, op, "x")
    _nonnegative(k, op, "k")
    _values(x, op, "x")
    _check_no_nan(x, op)
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
    _vector(x, op, "x")
    if num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be >= 1, got {num_blocks}")
    _nonnegative(k_per_block, op, "k_per_block")
    _values(x, op, "x")
    _check_no_nan(x, op)
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
        _vector(t, op, name)
    for t, name in ((acc, "acc"), (values, "values"), (indices, "indices")):
        _contiguous(t, op, name)
    if num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be >= 1, got {num_blocks}")
    _nonnegative(k_per_block, op, "k_per_block")
    _values(acc, op, "acc", full=True)
    _same_dtype(acc, g, op, "acc", "g")
    _same_dtype(acc, values, op, "acc", "values")
    if indices.dtype != torch.int64:
        raise TypeError(f"{op}: indices must be int64, got {indices.dtype}")
    _same_length(acc, g, op, "acc", "g")
    n = acc.numel()
    q, r = divmod(n, num_blocks)
    m = 0 if n == 0 or k_per_block == 0 else r * min(k_per_block, q + 1) + (num_blocks - r) * min(k_per_block, q)
    if values.numel() != m or indices.numel() != m:
        raise ValueError(f"{op}: values and indices must hold {m} entries (the block top-k count of N={n}, "
                         f"num_blocks={num_blocks}, k_per_block={k_per_block}), got {values.numel()} and "
                         f"{indices.numel()}")
    for t, name in ((g, "g"), (values, "values"), (indices, "indices")):
        if _overlaps(acc, t):
            raise ValueError(f"{op}: acc and {name} share memory (acc is written while {name} is used)")
    if n == 0:
        return
    acc.add_(g)
    v, i = topk(acc, k_per_block, op) if num_blocks == 1 else block_topk(acc, num_blocks, k_per_block)
    values.copy_(v)
    indices.copy_(i)
    if clear:
        acc.index_fill_(0, i, 0)


# ------------------------------------------------------------ COO

def _check_sorted(op: str, i: torch.Tensor, name: str, n: Optional[int]) -> None:
    """Strictly ascending and inside [0, n) in full (the C kernels' fused check: the first
    fault by position is reported)."""
    if i.numel() == 0:
        return
    bad_order = torch.zeros_like(i, dtype=torch.bool)
    bad_order[1:] = i[1:] <= i[:-1]
    bad_range = (i < 0) if n is None or n < 0 else ((i < 0) | (i >= n))
    p = _first(bad_order | bad_range)
    if p is None:
        return
    v = int(i[p])
    if bool(bad_range[p]):
        bound = ">= 0" if v < 0 else f"< {n}"
        raise ValueError(f"{op}: {name} must hold indices {bound}, but {name}[{p}] = {v}")
    raise ValueError(f"{op}: {name} must be strictly ascending (sorted, no duplicates), but "
                     f"{name}[{p}] = {v} does not follow the entry before it")


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
        _vector(i, op, inames[p])
        _vector(v, op, vnames[p])
        _indices(i, op, inames[p])
        _values(v, op, vnames[p])
        if p:
            _same_dtype(indices[0], i, op, inames[0], inames[p])
            _same_dtype(values[0], v, op, vnames[0], vnames[p])
        _same_length(i, v, op, inames[p], vnames[p])
    for p, i in enumerate(indices):
        _check_sorted(op, i, inames[p], n)
    out_idx = torch.unique(torch.cat(list(indices)))  # sorted
    acc_dtype = torch.float32 if values[0].dtype in _HALF else values[0].dtype
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


def _check_index_range(op: str, idx: torch.Tensor, limit: int) -> None:
    if idx.numel():
        p = _first((idx < 0) | (idx >= limit))
        if p is not None:
            v = int(idx[p])
            bound = ">= 0" if v < 0 else f"< {limit}"
            raise ValueError(f"{op}: idx must hold indices {bound}, but idx[{p}] = {v}")


def _strictly_ascending(idx: torch.Tensor) -> bool:
    return idx.numel() < 2 or bool((idx[1:] > idx[:-1]).all())


def _check_scatter(op: str, dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> None:
    """What the C kernels check before a scatter writes anything (the same errors)."""
    _vector(dense, op, "dense")
    _vector(idx, op, "idx")
    _vector(val, op, "val")
    _contiguous(dense, op, "dense")
    _values(dense, op, "dense")
    _indices(idx, op, "idx")
    _same_dtype(dense, val, op, "dense", "val")
    _same_length(idx, val, op, "idx", "val")
    for t, name in ((val, "val"), (idx, "idx")):  # overlap first, as the C kernels
        if _overlaps(dense, t.contiguous()):
            raise ValueError(f"{op}: {name} partially overlaps the tensor written in place; pass a copy")
    _check_index_range(op, idx, dense.numel())


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
        work = torch.float32 if dense.dtype in _HALF else dense.dtype
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
    _vector(dense, op, "dense")
    _vector(idx, op, "idx")
    _values(dense, op, "dense")
    _indices(idx, op, "idx")
    _check_index_range(op, idx, dense.numel())
    return dense[idx.to(torch.int64)]


def nonfinite_flags(x: torch.Tensor) -> torch.Tensor:
    """1 (NaN) | 2 (+Inf) | 4 (-Inf) of what x holds, as a 0-dim int32 tensor on x's device:
    one aminmax (a NaN propagates to both ends, an Inf shows as an end), then, only when
    an end is not finite, one read per kind."""
    op = "sparsecomm.nonfinite_flags"
    _values(x, op, "x")
    flags = torch.zeros((), dtype=torch.int32, device=x.device)
    if x.numel() == 0:
        return flags
    ends = torch.stack(torch.aminmax(x.reshape(-1)))
    if bool(torch.isfinite(ends).all()):
        return flags
    for bit, test in ((1, torch.isnan), (2, torch.isposinf), (4, torch.isneginf)):
        flags += bit * test(x).any().to(torch.int32)
    return flags


# ------------------------------------------------------------ sparse streams

def stream_add_dd_(a: torch.Tensor, b: torch.Tensor) -> None:
    op = "sparsecomm.stream_add_dd_"
    _vector(a, op, "a")
    _vector(b, op, "b")
    _contiguous(a, op, "a")
    _same_length(a, b, op, "a", "b")
    _same_dtype(a, b, op, "a", "b")
    _values(a, op, "a", full=True)
    bc = b.contiguous()
    if bc.data_ptr() != a.data_ptr() and _overlaps(a, bc):
        raise ValueError(f"{op}: b partially overlaps the tensor written in place; pass a copy")
    a.add_(bc)


def stream_concat(idx_a, val_a, idx_b, val_b):
    op = "sparsecomm.stream_concat"
    for t, name in ((idx_a, "idx_a"), (val_a, "val_a"), (idx_b, "idx_b"), (val_b, "val_b")):
        _vector(t, op, name)
    _same_length(idx_a, val_a, op, "idx_a", "val_a")
    _same_length(idx_b, val_b, op, "idx_b", "val_b")
    _same_dtype(idx_a, idx_b, op, "idx_a", "idx_b")
    _same_dtype(val_a, val_b, op, "val_a", "val_b")
    _indices(idx_a, op, "idx_a")
    _values(val_a, op, "val_a")
    _check_sorted(op, idx_a, "idx_a", None)
    _check_sorted(op, idx_b, "idx_b", None)
    if idx_a.numel() and idx_b.numel() and int(idx_b[0]) <= int(idx_a[-1]):
        raise ValueError(f"{op}: idx_b must be strictly ascending (sorted, no duplicates), but idx_b[0] = "
                         f"{int(idx_b[0])} does not follow the entry before it")
    return torch.cat([idx_a, idx_b]), torch.cat([val_a, val_b])


# ------------------------------------------------------------ QSGD

def _u64(u: int) -> int:
    """An unsigned 64-bit constant as the int64 torch arithmetic wraps to."""
    u &= _MASK
    return u - (1 << 64) if u >= 1 << 63 else u


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser; int64 arithmetic wraps like uint64."""
    z = z ^ _srl(z, 30)
    z = z * _u64(0xBF58476D1CE4E5B9)
    z = z ^ _srl(z, 27)
    z = z * _u64(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def _qsgd_check(op: str, bits: int, bucket: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"{op}: bits must be 4 or 8, got {bits}")
    if bucket < 1 or (bits == 4 and bucket % 2):
        raise ValueError(f"{op}: bucket_size must be >= 1 (and even for 4 bits), got {bucket}")


def qsgd_uniform(seed: int, n: int, device) -> torch.Tensor:
    """The C kernel's draws (stream.c, qsgd_u01): element i gets the top 53 bits of
    splitmix64 of seed ^ (i * 0xD1B54A32D192ED03), as a float64 in [0, 1)."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    state = (i * _u64(0xD1B54A32D192ED03)) ^ _u64(seed)
    z = _mix(state + _u64(0x9E3779B97F4A7C15))
    return _srl(z, 11).to(torch.float64) * (1.0 / 9007199254740992.0)


def qsgd_quantize(x: torch.Tensor, bits: int, bucket_size: int, seed: int):
    """The C kernel's layout and draws (splitmix64 of (seed, index)): bit-identical."""
    op = "sparsecomm.qsgd_quantize"
    _vector(x, op, "x")
    _qsgd_check(op, bits, bucket_size)
    _values(x, op, "x", full=True)
    xf = x.to(torch.float64)
    n, s = xf.numel(), (1 << (bits - 1)) - 1
    p = _first(~(xf.abs() <= _FLT_MAX))  # NaN, Inf, or a float64 no float32 scale holds
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
    _vector(packed, op, "packed")
    _vector(scales, op, "scales")
    _qsgd_check(op, bits, bucket_size)
    _nonnegative(n, op, "n")
    if packed.dtype != torch.uint8:
        raise TypeError(f"{op}: packed must be uint8, got {packed.dtype}")
    if scales.dtype != torch.float32:
        raise TypeError(f"{op}: scales must be float32, got {scales.dtype}")
    if packed.numel() != (n * bits + 7) // 8:
        raise ValueError(f"{op}: packed must hold {(n * bits + 7) // 8} bytes for n = {n}, got {packed.numel()}")
    if scales.numel() != -(-n // bucket_size):
        raise ValueError(f"{op}: scales must hold {-(-n // bucket_size)} entries, got {scales.numel()}")
    if dtype not in _FULL_FLOATS:
        raise TypeError(f"{op}: dtype must be float32 or float64, got {dtype}")
    s = (1 << (bits - 1)) - 1
    if bits == 8:
        q = packed.to(torch.int64)
    else:
        q = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1).to(torch.int64)
    # peer data, validated in full before anything is decoded (the C kernel's order)
    p = _first(q[:n] > 2 * s)
    if p is not None:
        raise ValueError(f"{WIRE_PREFIX}{op}: packed is malformed at position {p if bits == 8 else p // 2} "
                         f"(a level above {2 * s})")
    if bits == 4 and n % 2 and int(q[n]) != 0:
        raise ValueError(f"{WIRE_PREFIX}{op}: packed is malformed at position {n // 2} (a non-zero unused nibble)")
    p = _first(~(torch.isfinite(scales) & (scales >= 0)))
    if p is not None:
        raise ValueError(f"{WIRE_PREFIX}{op}: scales is malformed at position {p} (must be finite and >= 0)")
    sc = scales.double().repeat_interleave(bucket_size)[:n]
    return ((q[:n] - s).double() * sc / s).to(dtype)


# ------------------------------------------------------------ Count-Sketch

def _row_keys(rows: int, seed: int, device) -> torch.Tensor:
    base = torch.tensor([_u64((seed & _MASK) + 0x9E3779B97F4A7C15 * (j + 1)) for j in range(rows)],
                        dtype=torch.int64, device="cpu")
    return _mix(base).to(device)


def _hashes(rows: int, cols: int, idx: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bucket, sign) of every (row, coordinate): sketch.h's hash family."""
    off = idx & (RUN - 1)
    h = _mix(_row_keys(rows, seed, idx.device)[:, None] ^ (idx // RUN)[None, :])
    hi = _srl(h, 32)
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
    _values(table, op, "table", full=True)
    if written:
        _contiguous(table, op, "table")


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
    _nonnegative(n, op, "n")
    _vector(val, op, "val")
    _values(val, op, "val", full=True)
    _vector(idx, op, "idx")
    _indices(idx, op, "idx")
    _same_length(idx, val, op, "idx", "val")
    _check_index_range(op, idx, n)
    keep = val != 0  # the C kernel skips zero values (a -0.0 in the table stays)
    _build(table, idx.to(torch.int64)[keep], val[keep], seed)


def sketch_build_(table: torch.Tensor, x: torch.Tensor, seed: int) -> None:
    op = "sparsecomm.sketch_build_"
    _check_table(table, op, True)
    _vector(x, op, "x")
    _values(x, op, "x", full=True)
    # every coordinate, zeros included (they add +-0, as in the C kernel)
    _build(table, torch.arange(x.numel(), dtype=torch.int64, device=x.device), x, seed)


def sketch_estimate_at(table: torch.Tensor, idx: torch.Tensor, seed: int,
                       op: str = "sparsecomm.sketch_estimate_at") -> torch.Tensor:
    _check_table(table, op, False)
    _vector(idx, op, "idx")
    _indices(idx, op, "idx")
    idx = idx.to(torch.int64)
    if idx.numel():
        p = _first(idx < 0)
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
    _nonnegative(n, op, "n")
    return sketch_estimate_at(table, torch.arange(n, dtype=torch.int64, device=table.device), seed, op)


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


# ------------------------------------------------------------ registration

def _no_return(fn: Callable) -> Callable:
    def op(*args):
        fn(*args)
    return op


def impls() -> Dict[str, Callable]:
    """Op name -> torch implementation, with the op schemas' signatures."""
    return {
        "topk": topk, "topk_radix": topk_radix, "block_topk": block_topk,
        "topk_accum_": _no_return(topk_accum_), "merge_add": merge_add,
        "merge_add_many": lambda i, v, n=-1: merge_add_many(i, v, None if n < 0 else n),
        "scatter_add_": _no_return(scatter_add_), "scatter_set_": _no_return(scatter_set_), "gather": gather,
        "nonfinite_flags": nonfinite_flags,
        "stream_add_dd_": _no_return(stream_add_dd_), "stream_concat": stream_concat,
        "qsgd_quantize": qsgd_quantize, "qsgd_dequantize": qsgd_dequantize,
        "sketch_build_": _no_return(sketch_build_), "sketch_build_coo_": _no_return(sketch_build_coo_),
        "sketch_estimate": sketch_estimate, "sketch_estimate_at": sketch_estimate_at,
        "densestream_encode_coo": densestream_encode_coo, "densestream_encode_dense": densestream_encode_dense,
        "densestream_add": densestream_add, "densestream_slice": densestream_slice,
        "densestream_add_into_": _no_return(densestream_add_into_), "densestream_to_coo": densestream_to_coo,
    }


#: ops that csrc/cuda has no kernel for: with the CUDA kernels built, CUDA tensors still run
#: these torch implementations (docs/kernels.md, "GPU")
CUDA_GAPS = ("topk_accum_", "scatter_set_", "nonfinite_flags")


def register(device: str = "cuda", names: Optional[Sequence[str]] = None) -> None:
    """Registers these implementations as the ``device`` kernels of the sparsecomm ops
    (``names``: only those)."""
    for name, fn in impls().items():
        if names is None or name in names:
            torch.library.register_kernel(f"sparsecomm::{name}", device, fn)
