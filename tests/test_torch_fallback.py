"""The GPU fallback path, tested without a GPU: every op's torch implementation
(``sparsecomm/ops/_torch_impl/``, what CUDA tensors run when the extension has no CUDA
kernels) against the C kernel on the same inputs, bit for bit or the same exception type;
every registered algorithm run through the torch implementations (``use_torch_ops``)
against the C path (outputs, residuals, bytes and rounds identical; consistency and
conservation); the switch itself (``SPARSECOMM_OPS=torch``).

The C kernels are tested against references written in the tests elsewhere
(test_ops, test_stream, test_sketch, test_algorithms, ...); equality with them carries
those references over to the torch path. ``make test-fallback`` also runs those files
whole with ``SPARSECOMM_OPS=torch``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import algorithms, ops
from sparsecomm.comm import simulate
from sparsecomm.ops import _switch

from _reference import make_gradients

LARGE = 300_001  # above every C kernel's parallel threshold
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
_INT_OF = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a tensor (so -0.0 != +0.0 and NaN payloads count)."""
    t = t.detach().contiguous()
    return t.view(_INT_OF[t.element_size()]) if t.is_floating_point() else t


def _outcome(build):
    """(kind, value) of one call: ("ok", tensors returned and tensors written) or ("raise", type)."""
    fn, args = build()
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return "raise", type(exc), str(exc)
    outs = out if isinstance(out, tuple) else (out,)
    written = tuple(a for a in args if isinstance(a, torch.Tensor))  # in-place ops write their first args
    return "ok", [o.clone() for o in outs if isinstance(o, torch.Tensor)], [w.clone() for w in written]


def _same(native, fallback, canonical_zero=False):
    assert native[0] == fallback[0], f"C path {native[:2]} but torch path {fallback[:2]}: {native[-1]} / {fallback[-1]}"
    if native[0] == "raise":
        assert native[1] is fallback[1], f"C raised {native[1].__name__} ({native[2]}), torch {fallback[1].__name__} ({fallback[2]})"
        return
    for a, b in zip(native[1] + native[2], fallback[1] + fallback[2]):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        if canonical_zero and a.is_floating_point():  # a median may pick either zero
            a, b = a + 0.0, b + 0.0
        assert torch.equal(_bits(a), _bits(b)), f"values differ at {(_bits(a) != _bits(b)).nonzero()[:5].tolist()}"


def _check(build, canonical_zero=False):
    native = _outcome(build)
    with ops.use_torch_ops():
        fallback = _outcome(build)
    _same(native, fallback, canonical_zero)


def _rng(seed):
    return np.random.default_rng(seed)


def _vector(pattern: str, n: int, dtype, seed=0) -> torch.Tensor:
    rng = _rng(seed)
    if pattern == "random":
        x = rng.standard_normal(n)
    elif pattern == "ties":  # magnitudes tie massively, both zeros
        x = rng.choice([-1.0, 1.0, 0.0, -0.0, 2.0, -2.0], n)
    elif pattern == "inf":
        x = rng.standard_normal(n)
        x[rng.choice(n, min(n, 5), replace=False)] = rng.choice([np.inf, -np.inf], min(n, 5))
    elif pattern == "nan":
        x = rng.standard_normal(n)
        x[n // 2] = np.nan
    else:
        raise ValueError(pattern)
    return torch.from_numpy(x).to(dtype)


# ------------------------------------------------------------------ top-k family

TOPK_CASES = [(n, k, p) for n in (0, 1, 1000) for k in (0, 1, 37, 1000, 1005) for p in ("random", "ties")] + \
    [(LARGE, 3000, "random"), (LARGE, 3000, "ties"), (1000, 10, "inf"), (1000, 999, "inf"), (1000, 5, "nan"),
     (1000, 0, "nan"), (1000, 1000, "nan"), (LARGE, 5, "nan")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,k,pattern", TOPK_CASES)
def test_topk(n, k, pattern, dtype):
    x = _vector(pattern, n, dtype, seed=n + k)
    _check(lambda: (ops.topk, (x, k)))
    if n <= 1000:
        _check(lambda: (ops.topk_radix, (x, k)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("blocks,k", [(1, 5), (3, 0), (3, 17), (7, 400), (1000, 1), (1500, 2), (64, 3000)])
@pytest.mark.parametrize("pattern", ["random", "ties", "inf"])
def test_block_topk(blocks, k, pattern, dtype):
    x = _vector(pattern, 1000 if blocks < 64 else LARGE, dtype, seed=blocks)
    _check(lambda: (ops.block_topk, (x, blocks, k)))


ACCUM_CASES = [(n, blocks, k, p) for n in (0, 1000) for blocks in (1, 3) for k in (0, 1, 37, 1005)
               for p in ("random", "ties")] + [(LARGE, 1, 3000, "random"), (LARGE, 1, 3000, "ties"),
                                              (LARGE, 7, 400, "random"), (1000, 1, 5, "nan"), (LARGE, 1, 5, "nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n,blocks,k,pattern", ACCUM_CASES)
@pytest.mark.parametrize("clear", [False, True])
def test_topk_accum(n, blocks, k, pattern, dtype, clear):
    e, g = _vector("random", n, dtype, seed=n + k), _vector(pattern, n, dtype, seed=k)

    def call(acc, grad):
        return ops.topk_accum_(acc, grad, k, num_blocks=blocks, clear=clear)
    _check(lambda: (call, (e.clone(), g)))


@pytest.mark.parametrize("bad", ["half", "overlap", "length", "2d", "blocks"])
def test_topk_accum_errors(bad):
    acc = torch.randn(100)
    g = {"half": torch.randn(100).half(), "overlap": acc, "length": torch.randn(99), "2d": torch.randn(100, 1),
         "blocks": torch.randn(100)}[bad]
    blocks = 0 if bad == "blocks" else 1
    _check(lambda: (lambda a, b: ops.topk_accum_(a, b, 5, num_blocks=blocks), (acc.clone() if bad != "overlap" else acc, g)))


@pytest.mark.parametrize("args", [
    lambda: (torch.randn(3, 4), 2), lambda: (torch.arange(10), 2), lambda: (torch.randn(10), -1),
    lambda: (_vector("nan", 10, torch.float32), 2)], ids=["2d", "int", "negative-k", "nan"])
def test_topk_errors(args):
    _check(lambda: (ops.topk, args()))
    a = args()
    _check(lambda: (ops.block_topk, (a[0], 2, max(a[1], 0))))
    _check(lambda: (ops.block_topk, (torch.randn(10), 0, 1)))


# ------------------------------------------------------------------ COO merges, scatter, gather

def _coo(n_dense, count, dtype, itype=torch.int64, seed=0, zeros=False):
    rng = _rng(seed)
    idx = torch.from_numpy(np.sort(rng.choice(n_dense, count, replace=False))).to(itype)
    val = torch.from_numpy(rng.standard_normal(count)).to(dtype)
    if zeros and count:
        val[::3] = -0.0
    return idx, val


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("parts", [1, 2, 5])
@pytest.mark.parametrize("count", [0, 40, 70_000])
def test_merge_add_many(parts, count, itype, dtype):
    vecs = [_coo(4 * count + 10, count if p % 2 == 0 else count // 2, dtype, itype, seed=p, zeros=True)
            for p in range(parts)]
    _check(lambda: (ops.merge_add_many, ([i for i, _ in vecs], [v for _, v in vecs], 4 * count + 10)))
    if parts == 2:
        (ia, va), (ib, vb) = vecs
        _check(lambda: (ops.merge_add, (ia, va, ib, vb)))
        _check(lambda: (ops.stream_add_ss, (ia, va, ib, vb)))


def _faulty(kind):
    idx = torch.arange(0, 2000, 2, dtype=torch.int64)
    if kind == "order":
        idx[500] = idx[499]
    elif kind == "negative":
        idx[0] = -4
    elif kind == "range":
        idx[-1] = 5000
    return idx


@pytest.mark.parametrize("kind", ["order", "negative", "range"])
def test_merge_rejects_what_the_kernel_rejects(kind):
    good = torch.arange(1, 2000, 2, dtype=torch.int64)
    bad = _faulty(kind)
    v = torch.ones(1000)
    _check(lambda: (ops.merge_add, (good, v, bad, v, 4000)))
    _check(lambda: (ops.merge_add_many, ([good, bad], [v, v], 4000)))
    _check(lambda: (ops.stream_concat, (bad, v, torch.tensor([9000]), torch.ones(1))))


@pytest.mark.parametrize("bad", ["dtypes", "lengths", "value-int", "index-float", "2d"])
def test_merge_argument_errors(bad):
    i, v = torch.arange(5), torch.ones(5)
    args = {"dtypes": (i, v, i.int(), v), "lengths": (i, v, i, torch.ones(4)),
            "value-int": (i, i, i, i), "index-float": (v, v, v, v), "2d": (i.view(1, 5), v, i, v)}[bad]
    _check(lambda: (ops.merge_add, args))
    _check(lambda: (ops.stream_concat, args))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("order", ["ascending", "repeats", "shuffled", "empty"])
def test_scatter_add_and_gather(order, itype, dtype):
    rng = _rng(3)
    n = 5000
    if order == "ascending":
        idx = np.sort(rng.choice(n, 2000, replace=False))
    elif order == "repeats":  # few slots, many additions: the order of the sum matters
        idx = rng.integers(0, 7, 20_000)
    elif order == "shuffled":
        idx = rng.permutation(n)[:3000]
    else:
        idx = np.zeros(0, dtype=np.int64)
    idx = torch.from_numpy(idx).to(itype)
    val = torch.from_numpy(rng.standard_normal(idx.numel())).to(dtype)
    dense = torch.from_numpy(rng.standard_normal(n)).to(dtype)
    _check(lambda: (ops.scatter_add_, (dense.clone(), idx, val)))
    _check(lambda: (ops.stream_add_sd_, (dense.clone(), idx, val)))
    _check(lambda: (ops.gather, (dense, idx)))
    for zero_rest in (False, True):  # repeats: the last value in input order on both
        _check(lambda: (ops.scatter_set_, (dense.clone(), idx, val, zero_rest)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("content", ["finite", "nan", "+inf", "-inf", "all", "empty"])
def test_nonfinite_flags(content, dtype):
    x = torch.from_numpy(_rng(4).standard_normal(LARGE)).to(dtype)
    plant = {"nan": [float("nan")], "+inf": [float("inf")], "-inf": [float("-inf")],
             "all": [float("-inf"), float("nan"), float("inf")]}.get(content, [])
    for j, value in enumerate(plant):
        x[(j + 1) * LARGE // 4] = value
    if content == "empty":
        x = x[:0]
    _check(lambda: (ops.nonfinite_flags, (x,)))


@pytest.mark.parametrize("bad", ["range", "negative", "overlap", "dtype", "noncontiguous", "index-dtype"])
def test_scatter_errors(bad):
    def build():
        dense = torch.arange(20, dtype=torch.float32)
        idx, val = torch.tensor([1, 3]), torch.ones(2)
        if bad == "range":
            idx = torch.tensor([1, 20])
        elif bad == "negative":
            idx = torch.tensor([-1, 3])
        elif bad == "overlap":
            val = dense[4:6]
        elif bad == "dtype":
            val = val.double()
        elif bad == "noncontiguous":
            dense = torch.arange(40, dtype=torch.float32)[::2]
        elif bad == "index-dtype":
            idx = idx.float()
        return ops.scatter_add_, (dense, idx, val)
    _check(build)
    _check(lambda: (ops.scatter_set_, build()[1] + (True,)))
    if bad in ("range", "negative", "index-dtype"):
        _check(lambda: (ops.gather, (torch.arange(20.0), build()[1][1])))


# ------------------------------------------------------------------ streams

@pytest.mark.parametrize("case", ["f32", "f64", "self", "overlap", "half", "length", "dtypes"])
def test_stream_add_dd(case):
    def build():
        a = torch.from_numpy(_rng(1).standard_normal(LARGE))
        b = torch.from_numpy(_rng(2).standard_normal(LARGE))
        if case == "f32":
            a, b = a.float(), b.float()
        elif case == "self":
            b = a
        elif case == "overlap":
            a, b = a[1:], a[:-1]
        elif case == "half":
            a, b = a.half(), b.half()
        elif case == "length":
            b = b[1:]
        elif case == "dtypes":
            b = b.float()
        return ops.stream_add_dd_, (a, b)
    _check(build)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stream_concat(dtype):
    ia, va = _coo(1000, 300, dtype, seed=1)
    ib, vb = _coo(1000, 300, dtype, seed=2)
    _check(lambda: (ops.stream_concat, (ia[ia < 500], va[ia < 500], ib[ib >= 500], vb[ib >= 500])))
    _check(lambda: (ops.stream_concat, (ia, va, ib, vb)))  # ranges overlap: rejected
    _check(lambda: (ops.stream_concat, (ia[:0], va[:0], ib, vb)))


# ------------------------------------------------------------------ QSGD

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bits,bucket", [(8, 1), (8, 128), (8, 1000), (4, 2), (4, 64), (4, 512)])
@pytest.mark.parametrize("n", [0, 1, 999, LARGE])
def test_qsgd_round_trip(n, bits, bucket, dtype):
    x = _vector("random", n, dtype, seed=n)
    if n > 2 * bucket + 2:
        x[:bucket] = 0.0  # an all-zero bucket: scale 0, middle level
        x[bucket + 1] = -0.0
    seed = 12345 + n
    _check(lambda: (ops.qsgd_quantize, (x, bits, bucket, seed)))
    packed, scales = ops.qsgd_quantize(x, bits, bucket, seed)
    _check(lambda: (ops.qsgd_dequantize, (packed, scales, n, bits, bucket, dtype)))


@pytest.mark.parametrize("case", ["inf", "nan", "beyond-float32", "bits", "odd-bucket", "half"])
def test_qsgd_quantize_errors(case):
    x = torch.randn(100, dtype=torch.float64)
    bits, bucket = 8, 16
    if case == "inf":
        x[50] = np.inf
    elif case == "nan":
        x[7] = np.nan
    elif case == "beyond-float32":
        x[3] = 1e300
    elif case == "bits":
        bits = 5
    elif case == "odd-bucket":
        bits, bucket = 4, 15
    elif case == "half":
        x = x.half()
    _check(lambda: (ops.qsgd_quantize, (x, bits, bucket, 1)))


@pytest.mark.parametrize("case", ["level", "nibble", "nan-scale", "negative-scale", "inf-scale", "size", "dtype"])
@pytest.mark.parametrize("bits", [4, 8])
def test_qsgd_dequantize_malformed(case, bits):
    n, bucket = 101, 16
    packed, scales = ops.qsgd_quantize(torch.randn(n), bits, bucket, 3)
    packed, scales = packed.clone(), scales.clone()
    if case == "level":
        packed[10] = 0xFF
    elif case == "nibble":
        packed[-1] |= 0xF0  # the unused high nibble (4 bits, odd n); for 8 bits a level above 2s
    elif case == "nan-scale":
        scales[2] = np.nan
    elif case == "negative-scale":
        scales[0] = -1.0
    elif case == "inf-scale":
        scales[-1] = np.inf
    elif case == "size":
        packed = packed[1:]
    elif case == "dtype":
        scales = scales.double()
    _check(lambda: (ops.qsgd_dequantize, (packed, scales, n, bits, bucket, torch.float32)))


# ------------------------------------------------------------------ Count-Sketch

SKETCH_SHAPES = [(1, 1), (1, 17), (3, 5), (3, 16), (4, 257), (5, 1000), (7, 64), (8, 300)]


@pytest.mark.parametrize("tdtype,xdtype", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                           (torch.float32, torch.float64)], ids=str)
@pytest.mark.parametrize("rows,cols", SKETCH_SHAPES)
def test_sketch_build_and_estimate(rows, cols, tdtype, xdtype):
    n = 5003
    x = _vector("random", n, xdtype, seed=rows * cols)
    x[::7] = 0.0
    x[1::11] = -0.0
    seed = -(2**62) + rows  # a negative schema int: the same uint64 seed on both paths
    start = torch.zeros(rows, cols, dtype=tdtype)
    start[0, 0] = -0.0  # a zero value of a dense input turns it into +0 in the C kernel
    _check(lambda: (ops.sketch_build_, (start.clone(), x, seed)))
    idx, val = _coo(n, 700, xdtype, seed=cols)
    rep = torch.cat([idx, idx[:50]])  # repeats add up in input order
    _check(lambda: (ops.sketch_build_coo_, (start.clone(), rep, torch.cat([val, val[:50]]), n, seed)))
    _check(lambda: (ops.sketch_build_coo_, (start.clone(), rep.int(), torch.cat([val, val[:50]]), n, seed)))
    table = ops.sketch_build_(torch.zeros(rows, cols, dtype=tdtype), x, seed)
    _check(lambda: (ops.sketch_estimate, (table, n, seed)), canonical_zero=True)
    _check(lambda: (ops.sketch_estimate_at, (table, rep, seed)), canonical_zero=True)


@pytest.mark.parametrize("case", ["range", "negative", "rows", "cols-2d", "dtype", "n"])
def test_sketch_errors(case):
    table, idx, val, n = torch.zeros(3, 64), torch.tensor([1, 5]), torch.ones(2), 10
    if case == "range":
        idx = torch.tensor([1, 10])
    elif case == "negative":
        idx = torch.tensor([-1, 5])
    elif case == "rows":
        table = torch.zeros(65, 8)
    elif case == "cols-2d":
        table = torch.zeros(64)
    elif case == "dtype":
        table = table.half()
    elif case == "n":
        n = -1
    _check(lambda: (ops.sketch_build_coo_, (table.clone(), idx, val, n, 1)))
    _check(lambda: (ops.sketch_estimate_at, (table, idx, 1)))
    _check(lambda: (ops.sketch_estimate, (table, n, 1)))



# ------------------------------------------------------------------ ZEN's hash partition and class bitmaps

#: (n, parts, block, seed) of the ZEN cases (tests/test_cuda.py runs them on CUDA too)
ZEN_SHAPES = [(0, 1, 1, 0), (5003, 3, 1, 9), (LARGE, 8, 64, 2**63 - 1), (4099, 33, 4, 12345)]


@pytest.mark.parametrize("n,parts,block,seed", ZEN_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zen_partition_and_bitmaps(n, parts, block, seed, dtype):
    rng = _rng(n + parts)
    idx = torch.from_numpy(np.sort(rng.choice(n, min(n, 2000), replace=False))).long()
    val = torch.from_numpy(rng.standard_normal(idx.numel())).to(dtype)
    _check(lambda: (ops.zen_partition, (idx, val, n, parts, seed, block)))
    got, _, counts = ops.zen_partition(idx, val, n, parts, seed, block)
    cuts = np.concatenate([[0], np.cumsum(counts.tolist())])
    for owner in range(min(parts, 3)):
        mine = got[cuts[owner]:cuts[owner + 1]]
        _check(lambda: (ops.zen_bitmap_encode, (mine, n, parts, seed, block, owner)))
        bitmap = ops.zen_bitmap_encode(mine, n, parts, seed, block, owner)
        _check(lambda: (ops.zen_bitmap_decode, (bitmap, n, parts, seed, block, owner)))


ZEN_ERRORS = ["order", "range", "parts", "block", "dtype", "other_class", "long_bitmap", "padding_bit", "owner"]


def zen_error_call(case: str):
    """(op, args) of a ZEN call that must fail (tests/test_cuda.py makes the same calls on CUDA)."""
    n, parts, block, seed = 1000, 3, 1, 5
    idx, val = torch.tensor([1, 5, 9]), torch.ones(3)
    if case in ("order", "range", "parts", "block", "dtype"):
        return ops.zen_partition, {"order": (torch.tensor([1, 5, 5]), val, n, parts, seed, block),
                                   "range": (torch.tensor([1, 5, n]), val, n, parts, seed, block),
                                   "parts": (idx, val, n, 0, seed, block),
                                   "block": (idx, val, n, parts, seed, 3),
                                   "dtype": (idx.int(), val, n, parts, seed, block)}[case]
    got, _, counts = ops.zen_partition(torch.arange(n), torch.ones(n), n, parts, seed, block)
    first_of_1 = got[int(counts[0]):int(counts[0]) + 1]
    empty = ops.zen_bitmap_encode(torch.tensor([], dtype=torch.int64), n, parts, seed, block, 0)
    if case == "other_class":
        return ops.zen_bitmap_encode, (first_of_1, n, parts, seed, block, 0)
    if case == "long_bitmap":
        return ops.zen_bitmap_decode, (torch.zeros(empty.numel() + 1, dtype=torch.uint8), n, parts, seed, block, 0)
    if case == "padding_bit":
        assert int(counts[0]) % 8
        bad = empty.clone()
        bad[-1] = 0x80
        return ops.zen_bitmap_decode, (bad, n, parts, seed, block, 0)
    return ops.zen_bitmap_decode, (empty, n, parts, seed, block, parts)


@pytest.mark.parametrize("case", ZEN_ERRORS)
def test_zen_errors(case):
    fn, args = zen_error_call(case)
    _check(lambda: (fn, args))

# ------------------------------------------------------------------ every algorithm on the torch path

#: extra option sets beside each algorithm's defaults (every registered algorithm runs with its
#: defaults; a new algorithm joins this matrix by registering)
EXTRA_OPTIONS = {
    "topkdsa": [{"quantize_bits": 4, "bucket_size": 64}, {"quantize_bits": 8}],
    "gssgd": [{"heavymix": "random"}, {"estimate": "full", "allreduce": "tree", "p1": None}],
    "spardl": [{"teams": 2}],
}
MATRIX = [(name, options) for name in algorithms.names()
          for options in [{}] + EXTRA_OPTIONS.get(name, [])]
CONFIGS = [  # P, N, density, dtype, pattern
    (4, 3001, 0.02, torch.float32, "random"),
    (6, 2053, 0.05, torch.float64, "overlap"),
    (3, 1025, 0.03, torch.bfloat16, "ties"),
]


def _history(name, options, size, n, density, dtype, pattern, steps=2):
    grads = [make_gradients(pattern, n, size, step, dtype, seed=7) for step in range(steps)]

    def rank(comm):
        if name == "spardl" and options.get("teams") and size % options["teams"]:
            return None
        reducer = sc.SparseAllreduce(name, density, comm=comm, **options)
        runs = []
        for step in range(steps):
            before = reducer.residual.clone() if reducer.residual is not None else None
            out = reducer(grads[step][comm.rank].clone())
            stats = reducer.last_stats
            runs.append((out.clone(), before, reducer.residual.clone(),
                         (stats["bytes_sent"], stats["bytes_recv"], stats["rounds"], stats["nnz_out"])))
        return runs

    return simulate(size, rank).results, grads


@pytest.mark.parametrize("name,options", MATRIX, ids=[f"{n}-{o}" if o else n for n, o in MATRIX])
@pytest.mark.parametrize("size,n,density,dtype,pattern", CONFIGS, ids=[f"P{c[0]}-{c[3]}" for c in CONFIGS])
def test_algorithm_on_the_torch_path(name, options, size, n, density, dtype, pattern):
    if name == "spardl" and options.get("teams") and size % options["teams"]:
        pytest.skip("teams must divide P")
    native, grads = _history(name, options, size, n, density, dtype, pattern)
    with ops.use_torch_ops():
        fallback, _ = _history(name, options, size, n, density, dtype, pattern)
    for step in range(len(grads)):
        outs = [fallback[r][step][0] for r in range(size)]
        for r in range(size):
            out, before, after, cost = fallback[r][step]
            n_out, n_before, n_after, n_cost = native[r][step]
            # the same bits and the same bytes and rounds as the C path
            assert torch.equal(_bits(out), _bits(n_out)), (step, r, "output")
            assert torch.equal(_bits(after), _bits(n_after)), (step, r, "residual")
            assert cost == n_cost, (step, r, cost, n_cost)
            # consistency: every rank holds the same result
            assert torch.equal(_bits(out), _bits(outs[0])), (step, r, "differs from rank 0")
        # conservation: what left the residuals is what the output holds
        sent = sum((grads[step][r].double() + (fallback[r][step][1].double() if fallback[r][step][1] is not None
                                                else 0.0) - fallback[r][step][2].double()) for r in range(size))
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
        assert torch.allclose(sent, outs[0].double(), rtol=tol, atol=tol * float(sent.abs().max() + 1)), (step,)


# ------------------------------------------------------------------ the switch

def test_switch_nests_and_restores_the_c_kernels():
    x = torch.randn(10)
    assert not ops.torch_ops_enabled()
    with ops.use_torch_ops():
        with ops.use_torch_ops():
            assert ops.torch_ops_enabled()
        assert ops.torch_ops_enabled()
        # the C binding names its own device rule; the torch implementation has none
        assert ops.topk(x, 3)[1].tolist() == ops._torch_impl.topk(x, 3)[1].tolist()
    assert not ops.torch_ops_enabled()


def test_switch_reroutes_the_dispatcher(monkeypatch):
    calls = []
    real = ops._torch_impl.impls

    def counting():
        table = real()
        topk = table["topk"]
        table["topk"] = lambda x, k: (calls.append(k), topk(x, k))[1]
        return table

    monkeypatch.setattr(ops._torch_impl, "impls", counting)
    x = torch.randn(50)
    ops.topk(x, 4)
    assert calls == []  # the C kernel
    with ops.use_torch_ops():
        ops.topk(x, 4)
        torch.ops.sparsecomm.topk(x, 5)
    assert calls == [4, 5]
    ops.topk(x, 6)
    assert calls == [4, 5]


def test_environment_variable(monkeypatch):
    monkeypatch.setenv(_switch.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="SPARSECOMM_OPS='cuda': must be 'torch'"):
        _switch.apply_environment()
    monkeypatch.setenv(_switch.ENV_VAR, "native")
    _switch.apply_environment()
    assert not ops.torch_ops_enabled()
    code = ("import sparsecomm.ops as o, torch; assert o.torch_ops_enabled(); "
            "from sparsecomm.formats import coo; print('ok')")
    env = dict(os.environ, SPARSECOMM_OPS="torch")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_torch_implementation_is_the_fallback_and_names_what_exists():
    x = _vector("ties", 5000, torch.float32, seed=9)
    ref_v, ref_i = ops.topk(x, 37)  # the C kernel on CPU
    v, i = ops.torch_implementation("topk")(x, 37)
    assert torch.equal(i, ref_i) and torch.equal(_bits(v), _bits(ref_v))
    with pytest.raises(ValueError, match="no op 'topk_fast'.*known: block_topk"):
        ops.torch_implementation("topk_fast")
