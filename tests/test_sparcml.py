"""SparCML's algorithms (sparcml_recursive_double, sparcml_split_allgather, topkdsa,
sparcml) against the invariants of README.md's "Behaviour you can rely on": consistency,
exactness, conservation, and rounds / bytes per rank within the bounds of section 4. The
reference is plain numpy written here (each rank's top-k of gradient + residual, summed densely)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.algorithms.sparcml import choose
from sparsecomm.comm import simulate
from sparsecomm.formats.stream import stream_delta
from sparsecomm.testing import spawn

from _reference import make_gradients, ref_k, ref_topk_indices

STEPS = 3
ALGS = ["sparcml_recursive_double", "sparcml_split_allgather", "topkdsa", "sparcml"]


def history(comm, algorithm, density, grads_by_step, **options):
    reducer = sc.SparseAllreduce(algorithm, density, comm=comm, **options)
    runs = []
    for grads in grads_by_step:
        out = reducer(grads[comm.rank].clone())
        runs.append((out.clone(), reducer.residual.clone(), dict(reducer.last_stats)))
    return runs


def lg(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


def cost_bounds(algorithm, size, rank, n, k, isize, probe=False):
    """(min bytes, max bytes, rounds) this rank sends / takes, from section 4's bounds
    plus headers (56 B per stream message at most) and the size words: inside a reducer call no
    round goes to sizes (MPI probes; gloo and the simulated Comm send each message's 8-byte size
    just before it, and a message of several all-gather blocks heads them with their sizes)."""
    if size == 1 or n == 0:
        return 0, 0, 0
    var = 1                                      # exchange_var: one round
    item = isize + 4
    dense_bytes = n * isize
    if algorithm == "sparcml_recursive_double":
        p2 = 1 << (size.bit_length() - 1)
        L = int(math.log2(p2))
        if rank >= p2:                           # folded: one message out, the result back
            return 40, 64 + k * item, 2 * var
        fold = rank + p2 < size
        lo = L * (40 + min(k * item, dense_bytes))
        hi = sum(64 + min((2 ** t) * k * (2 if p2 != size else 1) * item, dense_bytes) for t in range(L))
        if fold:
            hi += 64 + min(size * k * item, dense_bytes)
        return lo, hi, (L + 2 * fold) * var
    split_lo = 40 * (size - 1)
    split_hi = 64 * (size - 1) + k * item
    if algorithm == "sparcml_split_allgather":
        # Bruck sends the blocks it holds first: its own in every round, others once or more
        words = 0 if probe else 8 * (size - 1)   # the split messages' sizes
        ag_hi = 8 * (size - 1) + lg(size) * (8 + 56 * size + min(size * k * item, dense_bytes + 8 * size))
        return split_lo + words, split_hi + words + ag_hi, var + lg(size)
    assert algorithm == "topkdsa"
    b = [j * n // size for j in range(size + 1)]
    block = [40 + ((b[j + 1] - b[j]) * isize + 7) // 8 * 8 for j in range(size)]
    ag, d = 0, 1
    while d < size:  # Bruck: at distance d a rank sends the first min(d, P - d) blocks it holds
        ag += sum(block[(rank + j) % size] for j in range(min(d, size - d)))
        d *= 2
    return split_lo + ag, split_hi + ag, var + lg(size)


def check(size, algorithm, density, n, dtype, pattern, results=None, options=None, seed=0, probe=False):
    options = options or {}
    grads_by_step = [make_gradients(pattern, n, size, step, dtype, seed) for step in range(STEPS)]
    if results is None:
        results = simulate(size, lambda comm: history(comm, algorithm, density, grads_by_step, **options)).results
    grads_by_step = grads_by_step[:len(results[0])]  # a run may have taken fewer steps
    k = ref_k(density, n)
    residuals = [torch.zeros(n, dtype=torch.float64) for _ in range(size)]
    isize = torch.empty((), dtype=dtype).element_size()
    for step, grads in enumerate(grads_by_step):
        expected = np.zeros(n)
        for rank in range(size):
            acc = (residuals[rank] + grads[rank].double()).to(dtype)
            sent = np.zeros(n)
            sel = ref_topk_indices(acc, k)
            sent[sel] = acc.double().numpy()[sel]
            expected += sent
            residuals[rank] = acc.double() - torch.from_numpy(sent)
        outs = [results[rank][step][0] for rank in range(size)]
        for rank in range(1, size):
            assert torch.equal(outs[rank], outs[0]), f"{algorithm} step {step}: rank {rank} differs from rank 0"
        tol = {torch.float64: 1e-12, torch.float32: 1e-5}[dtype]
        scale = max(1.0, float(np.abs(expected).max()) if n else 1.0)
        np.testing.assert_allclose(outs[0].double().numpy(), expected, rtol=tol, atol=tol * scale * size)
        for rank in range(size):
            np.testing.assert_allclose(results[rank][step][1].double().numpy(), residuals[rank].numpy(),
                                       rtol=1e-6, atol=1e-6 * scale)
            stats = results[rank][step][2]
            if algorithm == "sparcml":
                continue
            lo, hi, rounds = cost_bounds(algorithm, size, rank, n, k, isize, probe)
            assert stats["rounds"] == rounds, (algorithm, step, rank, stats, rounds)
            assert lo <= stats["bytes_sent"] <= hi, (algorithm, step, rank, stats["bytes_sent"], lo, hi)
    return results


SIM = [  # (P, N, density, dtype, pattern)
    (1, 1025, 0.01, torch.float32, "random"),
    (2, 1025, 0.01, torch.float32, "random"),
    (3, 1025, 0.1, torch.float32, "overlap"),
    (5, 1000, 0.05, torch.float64, "disjoint"),
    (6, 2, 0.5, torch.float32, "random"),
    (7, 1, 0.001, torch.float32, "random"),
    (4, 0, 0.01, torch.float32, "random"),
    (8, 1025, 1.0, torch.float32, "random"),         # k = N: dense from the start
    (8, 4099, 0.07, torch.float32, "random"),        # fill-in forces the dense switch mid-reduction
    (12, 4097, 0.01, torch.float32, "disjoint"),
    (16, 4097, 0.002, torch.float32, "overlap"),
    (33, 2053, 0.01, torch.float64, "random"),
]


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("size,n,density,dtype,pattern", SIM)
def test_invariants_simulated(algorithm, size, n, density, dtype, pattern):
    check(size, algorithm, density, n, dtype, pattern)


def test_dense_switch_happens_mid_reduction(monkeypatch):
    """P = 8, k = 7% of N: rounds 0 and 1 stay sparse (2k, 4k items), the bound 8k passes
    delta = N/2 in the last round, where every rank switches its whole vector to dense."""
    from sparsecomm.algorithms import _sparse_stream as fs
    n, density = 4099, 0.07
    k = ref_k(density, n)
    calls = []
    real = fs.SparseStream.densified

    def spy(self):
        if not self.is_dense:
            calls.append((self.count, self.n))
        return real(self)
    monkeypatch.setattr(fs.SparseStream, "densified", spy)
    grads = [make_gradients("random", n, 8, 0, torch.float32)]
    simulate(8, lambda comm: history(comm, "sparcml_recursive_double", density, grads))
    full = [c for c in calls if c[1] == n]
    assert len(full) == 8, calls                      # once per rank
    assert all(2 * k < count <= 4 * k for count, _ in full), (k, full)  # the 4k-item stream after the second doubling step


GLOO = [  # (algorithm, N, density, dtype, pattern, options)
    ("sparcml_recursive_double", 1025, 0.02, torch.float32, "random", {}),
    ("sparcml_split_allgather", 3001, 0.05, torch.float64, "disjoint", {}),
    ("topkdsa", 1003, 0.03, torch.float32, "overlap", {}),
    ("sparcml", 2001, 0.2, torch.float32, "random", {}),
]


def _gloo_rank(rank, world_size, cases):
    from sparsecomm.comm import TorchComm
    comm = TorchComm()
    runs = []
    for algorithm, density, grads_by_step, options in cases:
        runs.append([(o.numpy(), r.numpy(), s) for o, r, s in history(comm, algorithm, density, grads_by_step,
                                                                         **options)])
    return runs


@pytest.mark.distributed
@pytest.mark.parametrize("size", range(1, 9))
def test_invariants_on_gloo_ranks(size):
    cases = [(alg, d, [make_gradients(p, n, size, s, dt) for s in range(STEPS)], o) for alg, n, d, dt, p, o in GLOO]
    runs = spawn(_gloo_rank, size, cases, timeout=180)
    for i, (alg, n, d, dt, p, o) in enumerate(GLOO):
        results = [[(torch.from_numpy(a), torch.from_numpy(b), c) for a, b, c in runs[r][i]] for r in range(size)]
        check(size, alg, d, n, dt, p, results=results, options=o)


# -- QSGD -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("size", [3, 4])
def test_topkdsa_quantized_conservation_and_consistency(bits, size):
    n, density = 3001, 0.1
    grads_by_step = [make_gradients("random", n, size, s, torch.float32) for s in range(4)]
    res = simulate(size, lambda c: history(c, "topkdsa", density, grads_by_step, quantize_bits=bits,
                                           bucket_size=64)).results
    carried = [torch.zeros(n, dtype=torch.float64) for _ in range(size)]
    for step, grads in enumerate(grads_by_step):
        outs = [res[r][step][0] for r in range(size)]
        for r in range(1, size):
            assert torch.equal(outs[r], outs[0])
        total_in = sum(carried[r] + grads[r].double() for r in range(size))
        carried = [res[r][step][1].double() for r in range(size)]
        total_out = outs[0].double() + sum(carried)
        np.testing.assert_allclose(total_out.numpy(), total_in.numpy(), atol=1e-4)
        # wire: the all-gather part carries bits per value, not 32
        stats = res[0][step][2]
        assert stats["bytes_sent"] < (size - 1) / size * n * 4 * (bits / 32) + n * density * 8 + 4000


def test_topkdsa_quantized_unbiased():
    """The mean dequantized sum over many independent draws converges to the exact sum."""
    size, n, trials = 4, 512, 150
    grads = make_gradients("random", n, size, 0, torch.float32)
    exact = sum(g.double() for g in grads)

    def fn(comm):
        outs = []
        for t in range(trials):
            alg = sc.algorithms.get("topkdsa")(comm, quantize_bits=4, bucket_size=64, seed=t)
            out = torch.empty(n)
            alg.reduce(grads[comm.rank].clone(), n, out)
            outs.append(out.double())
        return torch.stack(outs)
    runs = simulate(size, fn).results[0]
    mean = runs.mean(0)
    single = (runs[0] - exact).abs().mean()
    err = (mean - exact).abs().mean()
    assert err < single / 6, (float(err), float(single))  # ~ 1/sqrt(trials) of one draw's error


def test_topkdsa_quantized_draws_differ_across_steps_ranks_and_seeds():
    """QSGD's stochastic rounding draws afresh every step, on every rank and for every seed
    option (also seeds that differ only above bit 31): one fixed input, reduced again and
    again by one instance, must round differently each call; two ranks' ranges holding the
    same values must round differently; seed=0, 2**31 and 2**32 must round differently. Each
    result stays within one level of the exact sum (the level step is max|x| / 7 of its
    64-value bucket at 4 bits) and the mean over the calls converges to it (unbiased)."""
    size, n, bucket, steps = 2, 1024, 64, 48
    half = torch.randn(n // size, generator=torch.Generator().manual_seed(11))
    # both ranks send the same vector, whose two halves are equal: ranges 0 and 1 sum to the same values
    grads = [torch.cat([half, half]) for _ in range(size)]
    exact = (2 * torch.cat([half, half])).double()

    def fn(comm, seed=0, calls=steps):
        alg = sc.algorithms.get("topkdsa")(comm, quantize_bits=4, bucket_size=bucket, seed=seed)
        outs = []
        for _ in range(calls):
            out = torch.empty(n)
            alg.reduce(grads[comm.rank].clone(), n, out)
            outs.append(out.double())
        return torch.stack(outs)

    runs = simulate(size, fn).results
    assert torch.equal(runs[0], runs[1])                       # every rank decodes the same bytes
    outs = runs[0]
    step = exact.view(-1, bucket).abs().amax(1).repeat_interleave(bucket) / 7
    for t in range(steps):
        assert bool(((outs[t] - exact).abs() <= step * 1.0001 + 1e-6).all()), t   # one level at most
        assert not torch.equal(outs[t], exact), t                               # it did round
    # across steps: no two calls drew the same roundings
    distinct = {tuple(o.tolist()) for o in outs}
    assert len(distinct) == steps, f"{steps - len(distinct)} calls repeated an earlier call's roundings"
    # across ranks: rank 0 owns [0, 512), rank 1 [512, 1024), the same values, different draws
    for t in range(steps):
        assert not torch.equal(outs[t, :n // 2], outs[t, n // 2:]), f"call {t}: both ranks drew alike"
    # unbiased: the mean over the calls is much closer to the exact sum than one call
    single = (outs[0] - exact).abs().mean()
    err = (outs.mean(0) - exact).abs().mean()
    assert err < single / 3, (float(err), float(single))
    # across seed options, also those equal in their low 31 bits
    firsts = [simulate(size, lambda c, s=s: fn(c, seed=s, calls=1)).results[0][0] for s in (0, 2**31, 2**32)]
    assert torch.equal(firsts[0], outs[0])                     # seed=0 is the default-seeded run's first call
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(firsts[a], firsts[b]), ("seeds", a, b)


def test_options_validated():
    with pytest.raises(ValueError, match="quantize_bits"):
        sc.algorithms.get("topkdsa")(None, quantize_bits=3)
    with pytest.raises(ValueError, match="bucket_size"):
        sc.algorithms.get("topkdsa")(None, quantize_bits=4, bucket_size=63)
    with pytest.raises(ValueError, match="alpha"):
        sc.algorithms.get("sparcml")(None, alpha=-1)
    assert {"sparcml", "topkdsa", "sparcml_recursive_double", "sparcml_split_allgather"} <= set(sc.algorithms.names())
    assert sc.algorithms.get("topkdsa")(None).lossless
    assert not sc.algorithms.get("topkdsa")(None, quantize_bits=8).lossless


# -- the chooser ------------------------------------------------------------------------------
def test_chooser_regimes():
    # latency-dominated: little data -> recursive doubling
    assert choose(100_000, 10, 8, None) == "sparcml_recursive_double"
    # bandwidth-dominated, static (K << delta) with overlapping supports -> split all-gather
    n, k = 16_000_000, 160_000
    assert choose(n, k, 8, observed_k=int(1.5 * k)) == "sparcml_split_allgather"
    # dynamic: the reduced support passes delta -> dense all-gather (topkdsa)
    assert choose(n, n // 20, 16, None) == "topkdsa"
    assert choose(n, k, 8, observed_k=stream_delta(n, torch.float32)) == "topkdsa"
    # the same k flips from topkdsa to split once the observed fill-in is small
    assert choose(n, n // 50, 32, None) == "topkdsa"
    assert choose(n, n // 50, 32, observed_k=n // 40) == "sparcml_split_allgather"


def test_chooser_follows_observed_fill_in():
    n, size = 20_000, 8
    k = ref_k(0.1, n)   # P k = 0.8 N > delta: first call is dynamic; overlapping supports make K ~ k

    def fn(comm):
        red = sc.SparseAllreduce("sparcml", 0.1, comm=comm)
        g = torch.zeros(n)
        g[:k] = 1.0 + comm.rank
        choices = []
        for _ in range(2):
            red(g.clone())
            choices.append(red.algorithm.last_choice if hasattr(red, "algorithm") else None)
        return choices
    res = simulate(size, fn).results
    assert res[0][0] == "topkdsa" and res[0][1] != "topkdsa", res[0]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 1025])
def test_topkdsa_quantized_tiny_and_uneven(n):
    """N < P, empty ranges, odd lengths with 4-bit packing: consistent and conserving."""
    size = 5

    def fn(comm):
        red = sc.SparseAllreduce("topkdsa", 0.5, comm=comm, quantize_bits=4, bucket_size=2)
        g = torch.randn(n, generator=torch.Generator().manual_seed(comm.rank))
        out = red(g.clone())
        return g, out.clone(), red.residual.clone()
    r = simulate(size, fn).results
    assert all(torch.equal(x[1], r[0][1]) for x in r)
    total_in = sum(x[0].double() for x in r)
    total_out = r[0][1].double() + sum(x[2].double() for x in r)
    assert torch.allclose(total_in, total_out, atol=1e-5)


# -- MPI: exchange_var probes, so no size rounds ---------------------------------------------
_MPI_PROGRAM = r'''
import json, os, sys, traceback
sys.path[:0] = [sys.argv[2], os.path.join(sys.argv[2], "tests")]
from mpi4py import MPI
import torch
import sparsecomm as sc
from sparsecomm.comm import MPIComm
from _reference import make_gradients
out_dir = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
try:
    comm = MPIComm()
    res = {}
    for alg in ["sparcml_recursive_double", "sparcml_split_allgather", "topkdsa", "sparcml"]:
        red = sc.SparseAllreduce(alg, 0.05, comm=comm)
        rows = []
        for step in range(2):
            g = make_gradients("random", 3001, comm.size, step, torch.float32)
            out = red(g[comm.rank].clone())
            rows.append([out.tolist(), red.residual.tolist(), red.last_stats["rounds"],
                         red.last_stats["bytes_sent"]])
        res[alg] = rows
    result = {"rank": rank, "res": res}
except BaseException:
    result = {"rank": rank, "error": traceback.format_exc()}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
'''


@pytest.mark.mpi
@pytest.mark.parametrize("size", [3, 4])
def test_invariants_under_mpi(size, tmp_path):
    import importlib.util
    import os
    import shutil
    import subprocess
    import sys
    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    prog = tmp_path / "prog.py"
    prog.write_text(_MPI_PROGRAM)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(size), sys.executable, str(prog),
           str(tmp_path), root]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    import json
    outs = []
    for r in range(size):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
        outs.append(json.loads(path.read_text()))
        assert "error" not in outs[-1], outs[-1]["error"]
    for alg in ["sparcml_recursive_double", "sparcml_split_allgather", "topkdsa", "sparcml"]:
        # exactness, consistency, conservation, and rounds without size rounds (MPI probes)
        results = [[(torch.tensor(o), torch.tensor(e), {"rounds": rd, "bytes_sent": b})
                    for o, e, rd, b in outs[r]["res"][alg]] for r in range(size)]
        check(size, alg, 0.05, 3001, torch.float32, "random", results=results, probe=True)
