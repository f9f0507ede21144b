"""Tests of sparsecomm.ops against plain numpy/torch references written here."""
import functools
import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import ops
from sparsecomm.ops import _torch_impl

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HALF = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------- references

def ref_order(x: torch.Tensor) -> np.ndarray:
    """Positions sorted by (-|x|, index): a stable argsort by magnitude."""
    mag = x.to(torch.float64).abs().numpy()  # exact for all four dtypes
    return np.lexsort((np.arange(x.numel()), -mag))  # last key is primary


def ref_topk(x: torch.Tensor, k: int, order=None):
    """First k of the stable order; indices ascending; values x[indices]."""
    order = ref_order(x) if order is None else order
    idx_t = torch.from_numpy(np.sort(order[: min(k, x.numel())]).astype(np.int64))
    return x[idx_t], idx_t


def ref_block_order(x, num_blocks):
    """Sort positions by (block, -|x|, index); return (order, rank inside block)."""
    n = x.numel()
    pos = np.arange(n, dtype=np.int64)
    starts = np.arange(num_blocks, dtype=np.int64) * n // num_blocks
    blk = np.searchsorted(starts, pos, side="right") - 1  # largest b with start_b <= i
    mag = x.to(torch.float64).abs().numpy()
    order = np.lexsort((pos, -mag, blk))
    sorted_blk = blk[order]
    rank = pos - np.searchsorted(sorted_blk, sorted_blk, side="left")
    return order, rank


def ref_block_topk(x, num_blocks, kpb, order_rank=None):
    order, rank = order_rank or ref_block_order(x, num_blocks)
    idx_t = torch.from_numpy(np.sort(order[rank < kpb]).astype(np.int64))
    return x[idx_t], idx_t


def bits(t):
    t = t.contiguous()
    return t.view(torch.uint8) if t.numel() else t


def assert_same(got, want):
    gv, gi = got
    wv, wi = want
    assert gi.dtype == torch.int64
    assert gv.dtype == wv.dtype
    assert torch.equal(gi, wi), f"indices differ: got {gi[:10]}.. want {wi[:10]}.."
    # compare bit patterns (sign of zero, exact values)
    assert gv.shape == wv.shape
    assert torch.equal(bits(gv), bits(wv))


@functools.lru_cache(maxsize=None)
def make_data(n: int, kind: str, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000003 + n)
    if kind == "randn":
        x = torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "ties":  # few distinct magnitudes, random signs: many ties and +/- pairs
        x = torch.randint(0, 5, (n,), generator=g).to(torch.float64)
        x *= torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1
    elif kind == "zeros":  # +0.0 and -0.0 mixed
        x = torch.zeros(n, dtype=torch.float64)
        x[::3] = -0.0
    elif kind == "spikes":  # all equal except a few huge: the sample sees one value
        x = torch.full((n,), 0.5, dtype=torch.float64)
        x[torch.randint(0, max(n, 1), (min(n, 7),), generator=g)] = -1e3
    elif kind == "sorted":
        x = torch.linspace(-1, 1, n, dtype=torch.float64)
    elif kind == "chunk":  # all the mass in one contiguous chunk
        x = torch.randn(n, generator=g, dtype=torch.float64) * 1e-3
        lo = n // 3
        x[lo: lo + n // 50] = torch.randn(n // 50, generator=g, dtype=torch.float64) * 100
    else:
        raise ValueError(kind)
    return x.to(dtype)


def ks_for(n):
    ks = {0, 1, 5, max(1, n // 100), max(1, n // 10), n - 1, n, n + 3}
    return sorted(k for k in ks if k >= 0)


@pytest.fixture(params=["auto", "exact"])
def path(request):
    """The top-k to test: the automatic path, or the one forced through the exact radix path."""
    return ops.topk if request.param == "auto" else ops.topk_radix


# --------------------------------------------------------------------- top-k

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 1025, 2**20 + 3])
def test_topk_random_sizes(n, dtype, path):
    x = make_data(n, "randn", dtype)
    order = ref_order(x)
    for k in ks_for(n):
        assert_same(path(x, k), ref_topk(x, k, order))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_topk_million(dtype):
    n = 10**6
    x = make_data(n, "randn", dtype, seed=3)
    order = ref_order(x)
    for k in [1, 1000, 10000, 100000]:
        assert_same(ops.topk(x, k), ref_topk(x, k, order))


@pytest.mark.parametrize("kind", ["ties", "zeros", "spikes", "sorted", "chunk"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1025, 300_001])
def test_topk_adversarial(kind, dtype, n, path):
    x = make_data(n, kind, dtype)
    order = ref_order(x)
    for k in [1, 7, n // 100, n // 10, n // 2, n - 1]:
        assert_same(path(x, k), ref_topk(x, k, order))


def test_topk_many_candidates_parallel_select():
    # density ~12%: the candidate set is > 2^20, exercising the threaded selection
    n = 8_000_000
    x = make_data(n, "randn", torch.float32, seed=5)
    k = 1_000_000
    assert_same(ops.topk(x, k), ref_topk(x, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_topk_tie_rule_and_signs(dtype):
    x = torch.tensor([1.0, -2.0, 2.0, -0.0, 0.0, -2.0, 1.0, 0.5], dtype=dtype)
    v, i = ops.topk(x, 3)
    assert i.tolist() == [1, 2, 5]
    assert v.tolist() == [-2.0, 2.0, -2.0]
    v, i = ops.topk(x, 5)
    assert i.tolist() == [0, 1, 2, 5, 6]
    v, i = ops.topk(x, 7)  # one zero: -0.0 at index 3 wins the tie with +0.0 at 4
    assert i.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert math.copysign(1.0, float(v[3])) == -1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [10, 100_000, 1_000_000])
def test_topk_inf_selected_first(dtype, n):
    x = make_data(n, "randn", dtype).clone()
    x[n // 2] = float("inf")
    x[n // 3] = float("-inf")
    v, i = ops.topk(x, 2)
    assert i.tolist() == [n // 3, n // 2]
    assert v.tolist() == [float("-inf"), float("inf")]
    for k in [1, 3, n // 10]:
        assert_same(ops.topk(x, k), ref_topk(x, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 1000, 100_000, 1_500_000])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_topk_nan_raises(dtype, n, where, path):
    x = make_data(n, "randn", dtype).clone()
    pos = {"first": 0, "middle": n // 2, "last": n - 1}[where]
    x[pos] = float("nan")
    for k in [0, 1, max(1, n // 100), n]:
        with pytest.raises(ValueError, match="NaN"):
            path(x, k)


def test_topk_bad_args():
    with pytest.raises(ValueError, match="1-D"):
        ops.topk(torch.randn(3, 4), 2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        ops.topk(torch.randn(10), -1)
    with pytest.raises(TypeError, match="float32"):
        ops.topk(torch.arange(10), 2)
    # the operator itself checks too (ValueError from TORCH_CHECK_VALUE)
    with pytest.raises(ValueError, match="x must be a 1-D tensor"):
        torch.ops.sparsecomm.topk(torch.randn(2, 2), 1)


def test_topk_noncontiguous_input():
    base = torch.randn(2000)
    x = base[::2]
    assert_same(ops.topk(x, 17), ref_topk(x.contiguous(), 17))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_topk_torch_fallback(dtype):
    # the implementation used for non-CPU tensors, checked here on CPU
    for kind in ["randn", "ties", "zeros"]:
        x = make_data(1025, kind, dtype)
        for k in ks_for(1025):
            assert_same(_torch_impl.topk(x, k), ref_topk(x, k))


# --------------------------------------------------------------- block top-k

@pytest.mark.parametrize("dtype,n", [(d, n) for d in DTYPES for n in [0, 1, 2, 1025]]
                         + [(torch.float32, 2**20 + 3), (torch.bfloat16, 2**20 + 3)], ids=str)
def test_block_topk(n, dtype):
    x = make_data(n, "randn", dtype, seed=1)
    for B in sorted({1, 2, 3, 7, max(n, 1), n + 5}):
        order_rank = ref_block_order(x, B)
        for kpb in sorted({0, 1, 3, max(1, n // (100 * B)), n // B + 1}):
            got = ops.block_topk(x, B, kpb)
            assert_same(got, ref_block_topk(x, B, kpb, order_rank))


@pytest.mark.parametrize("kind", ["ties", "spikes", "zeros"])
def test_block_topk_ties(kind):
    n = 200_003
    x = make_data(n, kind, torch.float32)
    for B in [2, 3, 7, 64]:
        for kpb in [1, 50, 2000]:
            assert_same(ops.block_topk(x, B, kpb), ref_block_topk(x, B, kpb))


def test_block_topk_large_blocks_threaded():
    n = 3 * 2**20 + 11  # blocks of > 2^20 elements use the threaded top-k per block
    x = make_data(n, "randn", torch.float32, seed=9)
    for B, kpb in [(2, 1000), (3, 30000)]:
        assert_same(ops.block_topk(x, B, kpb), ref_block_topk(x, B, kpb))


def test_block_topk_errors():
    with pytest.raises(ValueError, match="num_blocks"):
        ops.block_topk(torch.randn(10), 0, 1)
    with pytest.raises(ValueError, match="k_per_block"):
        ops.block_topk(torch.randn(10), 2, -1)
    x = torch.randn(1000)
    x[999] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ops.block_topk(x, 7, 3)


# ----------------------------------------------------------------------- COO

def rand_coo(n, nnz, itype, vtype, g):
    idx = torch.randperm(n, generator=g)[:nnz].sort().values.to(itype)
    val = torch.randn(nnz, generator=g).to(vtype)
    return idx, val


def ref_merge(indices, values, vtype):
    """Union; sums accumulated in list order in float32 (float64 for float64), rounded once."""
    acc_np = np.float64 if vtype == torch.float64 else np.float32
    all_idx = np.unique(np.concatenate([i.to(torch.int64).numpy() for i in indices] + [np.zeros(0, np.int64)]))
    acc = np.zeros(all_idx.size, dtype=acc_np)
    for i, v in zip(indices, values):
        pos = np.searchsorted(all_idx, i.to(torch.int64).numpy())
        acc[pos] = acc[pos] + v.to(torch.float64).numpy().astype(acc_np)
    return torch.from_numpy(all_idx).to(indices[0].dtype), torch.from_numpy(acc).to(vtype)


def assert_coo_equal(got, want):
    gi, gv = got
    wi, wv = want
    assert gi.dtype == wi.dtype and gv.dtype == wv.dtype
    assert torch.equal(gi, wi)
    assert gv.shape == wv.shape
    assert torch.equal(bits(gv), bits(wv))


@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("vtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,nnz_a,nnz_b", [(10, 0, 0), (10, 0, 5), (10, 4, 0), (50, 30, 30),
                                            (10**6, 200_000, 100_000), (10**6, 1000, 300_000)])
def test_merge_add(itype, vtype, n, nnz_a, nnz_b):
    g = torch.Generator().manual_seed(n + nnz_a)
    a = rand_coo(n, nnz_a, itype, vtype, g)
    b = rand_coo(n, nnz_b, itype, vtype, g)
    got = ops.merge_add(a[0], a[1], b[0], b[1])
    assert_coo_equal(got, ref_merge([a[0], b[0]], [a[1], b[1]], vtype))
    # fallback implementation (used off-CPU) gives the same bits
    assert_coo_equal(_torch_impl.merge_add_many([a[0], b[0]], [a[1], b[1]]), got)


def test_merge_add_disjoint_and_identical():
    i1 = torch.arange(0, 200_000, 2)
    i2 = torch.arange(1, 200_000, 2)
    v1 = torch.ones(i1.numel())
    v2 = torch.full((i2.numel(),), 2.0)
    idx, val = ops.merge_add(i1, v1, i2, v2)
    assert torch.equal(idx, torch.arange(200_000))
    assert torch.equal(val[::2], v1) and torch.equal(val[1::2], v2)
    idx, val = ops.merge_add(i1, v1, i1, v1)
    assert torch.equal(idx, i1) and torch.equal(val, 2 * v1)


@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("vtype", DTYPES, ids=str)
@pytest.mark.parametrize("P,n,nnz", [(1, 100, 10), (3, 100, 40), (5, 1000, 0), (7, 10**6, 50_000),
                                      (16, 200_000, 20_000), (64, 5000, 100)])
def test_merge_add_many(itype, vtype, P, n, nnz):
    g = torch.Generator().manual_seed(P * 7 + n)
    ins = [rand_coo(n, nnz if p % 3 else nnz // 2, itype, vtype, g) for p in range(P)]
    indices = [i for i, _ in ins]
    values = [v for _, v in ins]
    got = ops.merge_add_many(indices, values)
    assert_coo_equal(got, ref_merge(indices, values, vtype))
    assert_coo_equal(_torch_impl.merge_add_many(indices, values), got)


def test_merge_add_many_order_matters_and_is_fixed():
    # 1e8 + 1 - 1e8 in float32: the list order decides the rounding
    idx = torch.tensor([5])
    vals = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])]
    _, v = ops.merge_add_many([idx] * 3, vals)
    assert v.item() == np.float32(np.float32(1e8) + np.float32(1.0)) - np.float32(1e8)
    for _ in range(3):
        _, v2 = ops.merge_add_many([idx] * 3, vals)
        assert torch.equal(v, v2)


@pytest.mark.parametrize("vtype", HALF, ids=str)
def test_merge_half_rounded_once(vtype):
    # three values whose float32 sum rounds differently than pairwise half sums
    idx = torch.tensor([0])
    vals = [torch.tensor([1.0], dtype=vtype), torch.tensor([2.0**-11 if vtype == torch.float16 else 2.0**-8],
                                                          dtype=vtype)] * 2
    _, v = ops.merge_add_many([idx] * 4, vals)
    want = (sum(float(t) for t in vals))
    assert v.item() == torch.tensor(want, dtype=torch.float32).to(vtype).item()


def test_merge_errors():
    i = torch.tensor([1, 3, 5])
    v = torch.ones(3)
    with pytest.raises(ValueError, match="strictly ascending"):
        ops.merge_add(torch.tensor([1, 5, 3]), v, i, v)
    with pytest.raises(ValueError, match="strictly ascending"):
        ops.merge_add(i, v, torch.tensor([1, 1, 3]), v)
    with pytest.raises(ValueError, match=">= 0"):
        ops.merge_add(torch.tensor([-1, 2, 3]), v, i, v)
    with pytest.raises(ValueError, match="< 4"):
        ops.merge_add(i, v, i, v, n=4)
    with pytest.raises(TypeError, match="must have the dtype of"):
        ops.merge_add(i.int(), v, i, v)
    with pytest.raises(TypeError, match="must have the dtype of"):
        ops.merge_add(i, v, i, v.double())
    with pytest.raises(ValueError, match="same length"):
        ops.merge_add(i, torch.ones(2), i, v)
    with pytest.raises(ValueError, match="at least one"):
        ops.merge_add_many([], [])
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.merge_add(i.float(), v, i, v)
    with pytest.raises(ValueError, match="1-D"):
        ops.merge_add(i.view(1, 3), v, i, v)
    # a large unsorted vector (parallel check)
    big = torch.arange(200_000)
    big[150_000] = 3
    with pytest.raises(ValueError, match=r"\[150000\]"):
        ops.merge_add_many([big, big], [torch.ones(200_000)] * 2)


# -------------------------------------------------------- scatter / gather

@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("vtype", DTYPES, ids=str)
def test_scatter_add_duplicates(itype, vtype):
    g = torch.Generator().manual_seed(11)
    n, m = 1000, 5000
    dense = torch.randn(n, generator=g).to(vtype)
    idx = torch.randint(0, n, (m,), generator=g).to(itype)
    val = torch.randn(m, generator=g).to(vtype)
    want = dense.clone()
    if vtype in HALF:  # each addition in float32, rounded to the dtype
        w = want.float()
        for j, v in zip(idx.tolist(), val.float().tolist()):
            w[j] = (torch.tensor(float(w[j]), dtype=torch.float32) + torch.tensor(v, dtype=torch.float32)).to(vtype).float()
        want = w.to(vtype)
    else:
        w = want.numpy().copy()
        np.add.at(w, idx.to(torch.int64).numpy(), val.numpy())
        want = torch.from_numpy(w)
    out = ops.scatter_add_(dense, idx, val)
    assert out.data_ptr() == dense.data_ptr()
    assert torch.equal(dense.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("vtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [0, 7, 100_000])
def test_gather(itype, vtype, m):
    g = torch.Generator().manual_seed(m)
    dense = torch.randn(50_000, generator=g).to(vtype)
    idx = torch.randint(0, 50_000, (m,), generator=g).to(itype)
    assert torch.equal(ops.gather(dense, idx), dense[idx.long()])


def _set_reference(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, zero_rest: bool) -> torch.Tensor:
    """dense[idx] = val one entry at a time in input order (the last of a repeat stays)."""
    want = torch.zeros_like(dense) if zero_rest else dense.clone()
    width = dense.element_size()
    w = want.view(torch.uint8).numpy().reshape(dense.numel(), width)
    v = val.view(torch.uint8).numpy().reshape(val.numel(), width)
    for j, i in enumerate(idx.tolist()):
        w[i] = v[j]
    return want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("zero_rest", [False, True], ids=["keep", "zero_rest"])
@pytest.mark.parametrize("order", ["ascending", "ascending_large", "repeats", "unsorted", "empty"])
@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("vtype", DTYPES, ids=str)
def test_scatter_set(vtype, itype, order, zero_rest, threads):
    g = torch.Generator().manual_seed(len(order) * 7 + threads)
    n = 600_007 if order == "ascending_large" else 40_003  # large: past the parallel thresholds
    dense = (torch.randn(n, generator=g) + 3).to(vtype)    # no zeros: the zeroing shows
    if order.startswith("ascending"):
        m = 300_000 if order == "ascending_large" else 4000
        idx = torch.randperm(n, generator=g)[:m].sort().values
        idx[0], idx[-1] = 0, n - 1                          # both ends (chunk edges)
        idx = idx.unique()
    elif order == "repeats":
        idx = torch.randint(0, 50, (5000,), generator=g)
    elif order == "unsorted":
        idx = torch.randperm(n, generator=g)[:5000]
    else:
        idx = torch.empty(0, dtype=torch.int64)
    idx = idx.to(itype)
    val = torch.randn(idx.numel(), generator=g).to(vtype)
    want = _set_reference(dense, idx, val, zero_rest)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = ops.scatter_set_(dense, idx, val, zero_rest=zero_rest)
    finally:
        torch.set_num_threads(before)
    assert out.data_ptr() == dense.data_ptr()
    assert torch.equal(dense.view(torch.uint8), want.view(torch.uint8))


def test_scatter_set_equals_zero_then_scatter_add():
    """What the algorithms rely on: for distinct indices, zero_rest is zero_() + scatter_add_."""
    g = torch.Generator().manual_seed(5)
    idx = torch.randperm(1_000_000, generator=g)[:10_000].sort().values
    val = torch.randn(10_000, generator=g)
    a, b = torch.randn(1_000_000, generator=g), torch.empty(1_000_000)
    ops.scatter_set_(a, idx, val, zero_rest=True)
    ops.scatter_add_(b.zero_(), idx, val)
    assert torch.equal(a, b)


def test_scatter_set_errors():
    d = torch.ones(10)
    for zero_rest in (False, True):
        with pytest.raises(ValueError, match="< 10"):
            ops.scatter_set_(d, torch.tensor([1, 10]), torch.zeros(2), zero_rest=zero_rest)
        assert torch.equal(d, torch.ones(10))  # nothing written, not even the zeros
    with pytest.raises(ValueError, match=">= 0"):
        ops.scatter_set_(d, torch.tensor([-1]), torch.zeros(1))
    with pytest.raises(TypeError, match="dtype of dense"):
        ops.scatter_set_(d, torch.tensor([1]), torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="same length"):
        ops.scatter_set_(d, torch.tensor([1, 2]), torch.zeros(1))
    with pytest.raises(ValueError, match="overlap"):
        ops.scatter_set_(d, torch.tensor([1, 2]), d[4:6])
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.scatter_set_(d, torch.tensor([1.0]), torch.zeros(1))
    assert torch.equal(d, torch.ones(10))


_NONFINITE = {"nan": (float("nan"), 1), "+inf": (float("inf"), 2), "-inf": (float("-inf"), 4)}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 33, 300_001])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_flags(dtype, n, threads):
    g = torch.Generator().manual_seed(n)
    base = torch.randn(n, generator=g).to(dtype)
    info = torch.finfo(dtype)
    base[0] = info.max            # the finite extremes and a subnormal are finite
    base[-1] = -info.max
    if n > 2:
        base[1] = info.smallest_normal / 4
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert ops.nonfinite_flags(base) == 0
        # one value planted at the ends and around the middle (both halves of the scan)
        for where in sorted({0, n // 2 - 1 if n > 1 else 0, n // 2, n - 1}):
            for kind, (value, bit) in _NONFINITE.items():
                x = base.clone()
                x[where] = value
                assert ops.nonfinite_flags(x) == bit, (kind, where)
        if n >= 3:
            x = base.clone()
            x[0], x[n // 2], x[-1] = float("-inf"), float("nan"), float("inf")
            assert ops.nonfinite_flags(x) == 7
            assert ops.nonfinite_flags(x[1:-1]) == 1        # a view: only what it covers
            assert ops.nonfinite_flags(x[::2]) == (5 if n // 2 % 2 == 0 else 4) | (2 if (n - 1) % 2 == 0 else 0)
    finally:
        torch.set_num_threads(before)


def test_nonfinite_flags_shapes_and_errors():
    x = torch.zeros(4, 5)
    assert ops.nonfinite_flags(x) == 0 and ops.nonfinite_flags(torch.empty(0)) == 0
    x[3, 4] = float("inf")
    assert ops.nonfinite_flags(x) == 2 and ops.nonfinite_flags(x.t()) == 2
    with pytest.raises(TypeError, match="float32"):
        ops.nonfinite_flags(torch.arange(3))


def test_scatter_gather_errors():
    d = torch.zeros(10)
    with pytest.raises(ValueError, match="< 10"):
        ops.scatter_add_(d, torch.tensor([1, 10]), torch.ones(2))
    assert torch.equal(d, torch.zeros(10))  # nothing written
    with pytest.raises(ValueError, match=">= 0"):
        ops.scatter_add_(d, torch.tensor([-1]), torch.ones(1))
    with pytest.raises(TypeError, match="dtype of dense"):
        ops.scatter_add_(d, torch.tensor([1]), torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="same length"):
        ops.scatter_add_(d, torch.tensor([1, 2]), torch.ones(1))
    with pytest.raises(ValueError, match="< 10"):
        ops.gather(d, torch.tensor([0, 11]))
    with pytest.raises(ValueError, match="1-D"):
        ops.gather(torch.zeros(2, 5), torch.tensor([0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fallbacks():
    x = torch.randn(100_000, device="cuda")
    v, i = ops.topk(x, 1000)
    rv, ri = ref_topk(x.cpu(), 1000)
    assert torch.equal(i.cpu(), ri) and torch.equal(v.cpu(), rv)
    v, i = ops.block_topk(x, 7, 50)
    rv, ri = ref_block_topk(x.cpu(), 7, 50)
    assert torch.equal(i.cpu(), ri)
    a = (torch.tensor([1, 4, 9], device="cuda"), torch.ones(3, device="cuda"))
    idx, val = ops.merge_add(a[0], a[1], a[0], a[1])
    assert idx.tolist() == [1, 4, 9] and val.tolist() == [2.0, 2.0, 2.0]
