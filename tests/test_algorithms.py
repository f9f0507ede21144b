"""dense, topka, densestream and zen against the invariants of README.md's "Behaviour you can rely on", on the
simulated Comm (P up to 64).

For every step and rank the test keeps its own copy of the residual and computes what the
algorithm must do with plain numpy: the locally selected vector, the expected sum, the
expected new residual, and the bytes and rounds of the algorithm's formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

from _reference import coo_message_bytes, make_gradients, ref_k, ref_topk_indices

STEPS = 3


def rank_history(comm, algorithm: str, density: float, grads_by_step: list[list[torch.Tensor]], **options):
    """Run the reducer for several steps on one rank; per step (out, residual after, stats)."""
    reducer = sc.SparseAllreduce(algorithm, density, comm=comm, **options)
    history = []
    for grads in grads_by_step:
        out = reducer(grads[comm.rank].clone())
        history.append((out.clone(), reducer.residual.clone(), dict(reducer.last_stats)))
    return history


def _gloo_rank(rank, world_size, cases):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    runs = []
    for algorithm, density, grads_by_step in cases:
        history = rank_history(comm, algorithm, density, grads_by_step)
        # tensors go back to the test process as numpy (not through shared memory)
        runs.append([(out.numpy(), residual.numpy(), stats) for out, residual, stats in history])
    return runs


def make_case(size, n, dtype, pattern):
    return [make_gradients(pattern, n, size, step, dtype) for step in range(STEPS)]


def check_lossless(size, algorithm, density, n, dtype, pattern, expect_cost, results=None):
    grads_by_step = make_case(size, n, dtype, pattern)
    if results is None:
        results = simulate(size, lambda comm: rank_history(comm, algorithm, density, grads_by_step)).results
    k = ref_k(density, n)
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    residuals = [torch.zeros(n, dtype=torch.float64) for _ in range(size)]
    for step, grads in enumerate(grads_by_step):
        expected = np.zeros(n)
        for rank in range(size):
            acc = (residuals[rank] + grads[rank].double()).to(work)  # what the rank holds, in its dtype
            if algorithm == "dense":
                selected = np.arange(n)
            else:
                selected = ref_topk_indices(acc, k)
            sent = np.zeros(n)
            sent[selected] = acc.double().numpy()[selected]
            expected += sent
            residuals[rank] = acc.double() - torch.from_numpy(sent)
        outs = [results[rank][step][0] for rank in range(size)]
        # 1. consistency: bit-identical on every rank
        for rank in range(1, size):
            assert torch.equal(outs[rank], outs[0]), f"step {step}: rank {rank} differs from rank 0"
        # 3. exactness: the dense sum of the locally selected vectors
        tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
        scale = max(1.0, float(np.abs(expected).max()) if n else 1.0)
        np.testing.assert_allclose(outs[0].double().numpy(), expected, rtol=tol, atol=tol * scale * size)
        # 2. conservation: each residual is what its rank did not send
        for rank in range(size):
            np.testing.assert_allclose(results[rank][step][1].double().numpy(), residuals[rank].numpy(),
                                       rtol=1e-6, atol=1e-6 * scale)
        # 4. volume and rounds of the formula
        for rank in range(size):
            stats = results[rank][step][2]
            want_bytes, want_rounds = expect_cost(size, n, k, torch.empty((), dtype=work).element_size())
            if callable(want_rounds):  # densestream: core, fold and folded ranks differ
                want_rounds = want_rounds(rank)
            assert stats["rounds"] == want_rounds, (step, rank, stats)
            if isinstance(want_bytes, tuple):
                assert want_bytes[0] <= stats["bytes_sent"] <= want_bytes[1], (step, rank, stats, want_bytes)
            else:
                assert stats["bytes_sent"] == want_bytes, (step, rank, stats, want_bytes)


def topka_cost(size, n, k, itemsize):
    if size == 1 or n == 0:
        return 0, 0
    return (size - 1) * coo_message_bytes(k, n, itemsize), math.ceil(math.log2(size))


def densestream_cost(size, n, k, itemsize):
    """DenseStream (section III-B, eqs. 4-6): rounds exactly -- the boundary all-reduce
    (ceil(log2 P)), 2 log2 p2 data rounds on a core rank, 2 fold rounds on a fold pair, no
    size rounds (inside a reducer call the simulated Comm and gloo send each size just before
    its message, into a receive of the call's bound); bytes within
    eq. 6's upper bound on elements ([(log2 p2 / 2 + 1) p2 - 1] k, k doubled on a folded
    core) plus the fold, each element at most a block's fields, its value and T zeros, plus
    the fixed part of each message."""
    if size == 1 or n == 0:
        return 0, 0
    p2 = 1 << (size.bit_length() - 1)
    lg = int(math.log2(p2))
    k_core = 2 * k if size != p2 else k
    w = max(1, (max(n - 1, 0).bit_length() + 7) // 8)
    t = -(-2 * w // itemsize)
    per_element = 2 * w + itemsize * (1 + t)
    elements = ((lg / 2 + 1) * p2 - 1) * k_core + size * k  # eq. 6 and the fold's message back
    messages = 2 * lg + 2
    boundary = (size - 1) * (32 + 8 * (p2 - 1))  # the Bruck all-gather of the headed int64 proposals

    def rounds(rank):
        return (math.ceil(math.log2(size)) + (2 * lg if rank < p2 else 0)
                + (2 if rank >= p2 or rank < size - p2 else 0))

    return (boundary, int(boundary + messages * (8 + 64 + 14) + per_element * elements)), rounds


def dense_cost(size, n, k, itemsize):
    if size == 1 or n == 0:
        return 0, 0
    # ring reduce-scatter + all-gather: 2(P-1) chunks of floor or ceil(N/P) elements
    return (2 * (size - 1) * (n // size) * itemsize, 2 * (size - 1) * math.ceil(n / size) * itemsize), 2 * (size - 1)


def zen_cost(size, n, k, itemsize):
    """ZEN's hash-balanced split: one push round of P - 1 COO messages, then the Bruck
    all-gather of the owners' pull messages -- 1 + ceil(log2 P) rounds exactly (inside a reducer
    call the sizes travel with the messages: no size rounds). Bytes: at least a 32-byte header
    per push message and per forwarded pull block (P - 1 of each); at most the rank's k pairs
    as COO with every push message's header, padding and size word, and P - 1 pull blocks each
    no larger than an index list of the min(P k, N) entries an owner can hold, padded, with two
    size words (its message's and its own in a message of several blocks)."""
    if size == 1 or n == 0:
        return 0, 0
    entry = (4 if n < 2**31 else 8) + itemsize
    push = (size - 1) * (32 + 7 + 8) + k * entry
    block = (32 + min(size * k, n) * entry + 7) // 8 * 8 + 16
    return (2 * (size - 1) * 32, push + (size - 1) * block), 1 + math.ceil(math.log2(size))


SWEEP = [  # (P, N, density, dtype, pattern)
    (1, 1025, 0.01, torch.float32, "random"),
    (2, 1025, 0.01, torch.float32, "random"),
    (3, 1025, 0.1, torch.float32, "overlap"),
    (4, 1025, 0.05, torch.float64, "disjoint"),
    (5, 2, 0.5, torch.float32, "random"),
    (6, 1, 0.001, torch.float32, "random"),
    (7, 0, 0.01, torch.float32, "random"),
    (8, 1025, 1.0, torch.float32, "random"),          # k >= N: dense input
    (3, 1025, 0.01, torch.float32, "zeros"),
    (5, 1025, 0.02, torch.float32, "ties"),
    (6, 1025, 0.01, torch.float16, "random"),
    (7, 1025, 0.01, torch.bfloat16, "random"),
    (12, 4097, 0.01, torch.float32, "random"),
    (16, 4097, 0.001, torch.float32, "disjoint"),
    (33, 2053, 0.01, torch.float64, "overlap"),
    (64, 1025, 0.01, torch.float32, "random"),
    (4, 2**20 + 3, 0.001, torch.float32, "random"),
]


@pytest.mark.parametrize("size,n,density,dtype,pattern", SWEEP)
def test_topka_invariants(size, n, density, dtype, pattern):
    check_lossless(size, "topka", density, n, dtype, pattern, topka_cost)


@pytest.mark.parametrize("size,n,density,dtype,pattern", [c for c in SWEEP if c[1] < 2**20 and c[0] <= 33])
def test_densestream_invariants(size, n, density, dtype, pattern):
    check_lossless(size, "densestream", density, n, dtype, pattern, densestream_cost)


@pytest.mark.parametrize("size,n,density,dtype,pattern", [c for c in SWEEP if c[1] < 2**20])
def test_zen_invariants(size, n, density, dtype, pattern):
    check_lossless(size, "zen", density, n, dtype, pattern, zen_cost)


@pytest.mark.parametrize("size,n,density,dtype,pattern", [c for c in SWEEP if c[1] < 2**20])
def test_dense_invariants(size, n, density, dtype, pattern):
    check_lossless(size, "dense", density, n, dtype, pattern, dense_cost)


@pytest.mark.parametrize("size", [1, 3])
def test_dense_nnz_out_counts_every_entry(size):
    """dense lets every entry through whatever the density: last_stats' nnz_out is N, which
    here is also the number of non-zeros of the sum computed in the test (random values)."""
    n, density = 1000, 0.01
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(40 + r)) for r in range(size)]
    want = torch.zeros(n, dtype=torch.float64)
    for g in grads:
        want += g.double()
    assert int(torch.count_nonzero(want)) == n

    def run(comm):
        red = sc.SparseAllreduce("dense", density, comm=comm)
        return red(grads[comm.rank].clone()), dict(red.last_stats)
    for out, stats in simulate(size, run).results:
        np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
        assert stats["nnz_out"] == int(torch.count_nonzero(want)) == n


GLOO_CASES = [  # (algorithm, N, density, dtype, pattern), run on every P in 1..8
    ("topka", 1025, 0.01, torch.float32, "random"),
    ("topka", 3001, 0.05, torch.float64, "disjoint"),
    ("dense", 1025, 1.0, torch.float32, "overlap"),
    ("densestream", 3001, 0.05, torch.float32, "random"),
    ("zen", 1025, 0.01, torch.float32, "random"),
    ("zen", 3001, 0.05, torch.float64, "disjoint"),
]


@pytest.mark.parametrize("size", range(1, 9))
def test_invariants_on_gloo_ranks(size):
    cases = [(alg, density, make_case(size, n, dtype, pattern)) for alg, n, density, dtype, pattern in GLOO_CASES]
    runs = spawn(_gloo_rank, size, cases, timeout=180)
    for case_index, (algorithm, n, density, dtype, pattern) in enumerate(GLOO_CASES):
        results = [[(torch.from_numpy(out), torch.from_numpy(res), stats) for out, res, stats in runs[rank][case_index]]
                   for rank in range(size)]
        # TorchComm counts the backend's dense allreduce with the ring formula
        cost = {"topka": topka_cost, "dense": dense_cost, "densestream": densestream_cost, "zen": zen_cost}[algorithm]
        check_lossless(size, algorithm, density, n, dtype, pattern, cost, results=results)


def test_registry_lists_baselines():
    assert {"dense", "topka", "densestream"} <= set(sc.algorithms.names())
    with pytest.raises(ValueError, match="unknown algorithm 'nope'.*topka"):
        sc.algorithms.get("nope")
