"""Count-Sketch kernels against a numpy Count-Sketch written here (same hash family,
re-implemented with numpy uint64 arithmetic, one coordinate at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.ops import _torch_impl

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def ref_hash(seed, rows, cols, n):
    """Runs of 16 coordinates: one hash per run and row gives the run's first bucket
    (consecutive buckets for the run, wrapping mod cols) and the 16 sign bits."""
    keys = [mix(np.uint64((seed + 0x9E3779B97F4A7C15 * (j + 1)) & 0xFFFFFFFFFFFFFFFF)) for j in range(rows)]
    i = np.arange(n, dtype=np.uint64)
    run, off = i >> np.uint64(4), i & np.uint64(15)
    h = np.stack([mix(key ^ run) for key in keys])
    first = ((h >> np.uint64(32)) * np.uint64(cols)) >> np.uint64(32)
    bucket = (first + off) % np.uint64(cols)
    sign = np.where((h >> off) & np.uint64(1), -1.0, 1.0)
    return bucket.astype(np.int64), sign


def ref_sketch(x, seed, rows, cols):
    bucket, sign = ref_hash(seed, rows, cols, len(x))
    table = np.zeros((rows, cols))
    for j in range(rows):
        np.add.at(table[j], bucket[j], sign[j] * x)
    return table


def ref_estimate(table, seed, n):
    rows, cols = table.shape
    bucket, sign = ref_hash(seed, rows, cols, n)
    return np.median(np.stack([sign[j] * table[j, bucket[j]] for j in range(rows)]), axis=0)


# shapes cover: runs that wrap around the row end (cols 64, 1000: offset + 16 > cols),
# cols < 16 (a run wraps onto itself), a partial last run (n % 16 != 0), n < 16, several
# estimate chunks of 2048 with 7 rows (the min/max network), even rows (mean of the middle
# two), and the multi-threaded paths (n >= 65536)
@pytest.mark.parametrize("rows,cols,n,seed", [(5, 64, 1000, 0), (4, 7, 300, 2**64 - 3), (1, 1, 5, 9),
                                              (3, 1000, 70000, 123), (7, 16, 4099, 5), (7, 5003, 100_001, 6),
                                              (2, 17, 15, 7)])
def test_build_and_estimate_match_numpy_reference(rows, cols, n, seed):
    rng = np.random.default_rng(rows + n)
    x = rng.integers(-50, 50, n).astype(np.float64)  # integer values: every sum is exact
    want = ref_sketch(x, seed, rows, cols)
    want_est = ref_estimate(want, seed, n)
    for tdtype in (torch.float32, torch.float64):
        for xdtype in (torch.float32, torch.float64):
            table = sc.ops.sketch_new(rows, cols, tdtype)
            sc.ops.sketch_build_(table, torch.from_numpy(x).to(xdtype), seed)
            np.testing.assert_array_equal(table.double().numpy(), want)
        est = sc.ops.sketch_estimate(table, n, seed)
        np.testing.assert_array_equal(est.double().numpy(), want_est)
        for m in (17, 5000):  # one chunk, and several (the threaded path)
            idx = torch.from_numpy(rng.integers(0, n, m))
            np.testing.assert_array_equal(sc.ops.sketch_estimate_at(table, idx, seed).double().numpy(),
                                          want_est[idx.numpy()])
        # the torch fallback (non-CPU devices) computes the same
        fallback = sc.ops.sketch_new(rows, cols, tdtype)
        _torch_impl.sketch_build_coo_(fallback, torch.arange(n), torch.from_numpy(x).to(tdtype), n, seed)
        np.testing.assert_array_equal(fallback.double().numpy(), want)
        np.testing.assert_array_equal(_torch_impl.sketch_estimate_at(table, torch.arange(n), seed).double().numpy(),
                                      est.double().numpy())


def test_linearity_exact_and_coo_equals_dense():
    rng = np.random.default_rng(1)
    n, seed = 200_003, 77  # large enough for the multi-threaded path
    a = torch.from_numpy(rng.integers(-1000, 1000, n).astype(np.float32))
    b = torch.from_numpy(rng.integers(-1000, 1000, n).astype(np.float32))
    b[rng.integers(0, n, 1000)] = 0
    sa, sb, sab = (sc.ops.sketch_build_(sc.ops.sketch_new(5, 4096), v, seed) for v in (a, b, a + b))
    assert torch.equal(sc.ops.sketch_merge_(sa.clone(), sb), sab)
    nz = b.nonzero().squeeze(1)
    for itype in (torch.int32, torch.int64):
        coo = sc.ops.sketch_build_coo_(sc.ops.sketch_new(5, 4096), nz.to(itype), b[nz], n, seed)
        assert torch.equal(coo, sb)
    # random float64 values: linear up to rounding
    x, y = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    sx, sy, sxy = (sc.ops.sketch_build_(sc.ops.sketch_new(3, 999, torch.float64), v, 5) for v in (x, y, x + y))
    torch.testing.assert_close(sx + sy, sxy, rtol=0, atol=1e-9)
    # different seeds give different sketches
    assert not torch.equal(sc.ops.sketch_build_(sc.ops.sketch_new(5, 4096), a, seed + 1), sa)


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(3)
    n, seed = 300_007, 11
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    nz = torch.from_numpy(rng.choice(n, 70_000, replace=False))
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            table = sc.ops.sketch_build_(sc.ops.sketch_new(7, 30_011), x, seed)
            coo = sc.ops.sketch_build_coo_(sc.ops.sketch_new(7, 30_011), nz, x[nz], n, seed)
            got.append((table, coo, sc.ops.sketch_estimate(table, n, seed), sc.ops.sketch_estimate_at(table, nz, seed)))
    finally:
        torch.set_num_threads(before)
    for other in got[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got[0], other))


def test_heavy_hitters_and_estimate_error():
    rng = np.random.default_rng(2)
    n, k = 100_000, 100
    x = rng.standard_normal(n)
    heavy = rng.choice(n, k, replace=False)
    x[heavy] = 50 * np.sign(rng.standard_normal(k))
    table = sc.ops.sketch_build_(sc.ops.sketch_new(5, 20000), torch.from_numpy(x), 3)
    est = sc.ops.sketch_estimate(table, n, 3).double().numpy()
    # Count-Sketch bound: |est - x| <= ~ ||x_tail||_2 / sqrt(cols) for most coordinates
    tail = np.sqrt((x ** 2).sum() - (x[heavy] ** 2).sum())
    err = np.abs(est - x)
    assert np.median(err) < tail / np.sqrt(20000)
    vals, idx = sc.ops.sketch_heavy_hitters(table, n, k, 3)
    assert len(set(idx.tolist()) & set(heavy.tolist())) >= 0.95 * k
    assert torch.equal(idx, idx.sort().values)


def test_errors():
    with pytest.raises(ValueError, match="rows"):
        sc.ops.sketch_new(0, 5)
    with pytest.raises(TypeError, match="float32 or float64"):
        sc.ops.sketch_build_(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3), 0)
    with pytest.raises(ValueError, match="indices < 10"):
        sc.ops.sketch_build_coo_(sc.ops.sketch_new(2, 3), torch.tensor([10]), torch.ones(1), 10, 0)
    with pytest.raises(ValueError, match="sketches differ"):
        sc.ops.sketch_merge_(sc.ops.sketch_new(2, 3), sc.ops.sketch_new(2, 4))
