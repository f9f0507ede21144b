"""``oktopk`` (Ok-Topk) against a reference written here in numpy.

The reference (:class:`RefOkTopk`) runs all P ranks of one call at once from the
specification in docs/oktopk.md: local top-k or reused local threshold (exact top-k again when
the reuse selects more than the local cap), boundaries as the integer mean of the ranks'
quantile proposals every tau_prime steps, region sums in rank order in the working dtype,
exact global top-k (ties to the lower index) every tau steps or when the reused global
threshold selects more than k, and the balanced blocks of the all-gather. It predicts the
result, every residual, the state, which thresholds were recomputed, the entries and the
exact bytes each rank sends. The simulated Comm runs P up to 33; gloo P = 1..6.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.algorithms.oktopk import bound_guaranteed, local_cap, volume_bound
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

from _reference import coo_message_bytes, ref_k, ref_topk_indices


# -- the reference ---------------------------------------------------------------------------
def _f32_key(x: np.ndarray) -> np.ndarray:
    return np.abs(x).astype(np.float32)


class RefOkTopk:
    def __init__(self, size: int, n: int, k: int, tau: int, tau_prime: int, dtype=np.float32):
        self.size, self.n, self.k, self.tau, self.tau_prime, self.dtype = size, n, min(k, n), tau, tau_prime, dtype
        self.step = 0
        self.lt = [None] * size
        self.gt = None
        self.bounds = None

    def call(self, accs: list[np.ndarray]):
        P, n, k, step = self.size, self.n, self.k, self.step
        events = {"local_exact": [], "global_exact": False, "repartition": False}
        sels = []
        for r in range(P):
            acc = accs[r]
            sel = None
            if self.lt[r] is not None and step % self.tau != 0:
                sel = np.nonzero(np.abs(acc) >= self.lt[r])[0]
                if P > 1 and sel.size > local_cap(k, P):
                    sel = None
            exact = sel is None
            if exact:
                sel = ref_topk_indices(torch.from_numpy(acc), k)
                self.lt[r] = float(np.abs(acc[sel]).min()) if sel.size else 0.0
            events["local_exact"].append(exact)
            sels.append(sel)
        repartition = self.bounds is None or step % self.tau_prime == 0
        if repartition:
            events["repartition"] = True
            voters = [s for s in sels if s.size]
            b = [0]
            for i in range(1, P):
                b.append(sum(int(s[(i * s.size) // P]) for s in voters) // len(voters) if voters else i * n // P)
            self.bounds = b + [n]
        bounds = self.bounds
        region = lambda idx: np.searchsorted(np.array(bounds[1:-1]), idx, side="right")  # noqa: E731
        # region sums in rank order, starting from the first contributor's value
        cand = []   # per owner: (indices ascending, sums)
        for j in range(P):
            acc_sum: dict[int, np.ndarray] = {}
            for r in range(P):
                s = sels[r]
                mine = s[(s >= bounds[j]) & (s < bounds[j + 1])]
                for i in mine:
                    v = accs[r][i]
                    acc_sum[int(i)] = v if int(i) not in acc_sum else (acc_sum[int(i)] + v).astype(self.dtype)
            idx = np.array(sorted(acc_sum), dtype=np.int64)
            cand.append((idx, np.array([acc_sum[i] for i in idx], dtype=self.dtype)))
        all_idx = np.concatenate([c[0] for c in cand])
        all_val = np.concatenate([c[1] for c in cand]) if all_idx.size else np.zeros(0, self.dtype)
        keys = _f32_key(all_val)
        keep = None
        if self.gt is not None and step % self.tau != 0:
            keep = keys >= np.float32(self.gt)
            if keep.sum() > k:
                keep = None
        radix = False
        if keep is None:
            events["global_exact"] = True
            if all_idx.size <= k:
                keep = np.ones(all_idx.size, dtype=bool)
                self.gt = 0.0
            else:
                radix = True
                order = np.lexsort((all_idx, -keys.astype(np.float64)))[:k]
                keep = np.zeros(all_idx.size, dtype=bool)
                keep[order] = True
                self.gt = float(keys[order].min())
        final_idx, final_val = all_idx[keep], all_val[keep]
        out = np.zeros(n, dtype=self.dtype)
        out[final_idx] = final_val
        residuals = []
        for r in range(P):
            res = accs[r].copy()
            dropped = sels[r][~np.isin(sels[r], final_idx)]
            res[sels[r]] = 0
            res[dropped] = accs[r][dropped]
            residuals.append(res)
        # volume: entries and exact bytes per rank
        g = [int(keep[sum(c[0].size for c in cand[:j]):sum(c[0].size for c in cand[:j + 1])].sum()) for j in range(P)]
        G = sum(g)
        block = [G // P + (1 if j < G % P else 0) for j in range(P)]
        bstart = [sum(block[:j]) for j in range(P)]
        lstart = [sum(g[:j]) for j in range(P)]
        itemsize = np.dtype(self.dtype).itemsize
        volumes, nbytes = [], []
        for r in range(P):
            if P == 1:
                volumes.append({"split": 0, "balance": 0, "allgather": 0})
                nbytes.append(0)
                continue
            regions = region(sels[r])
            split_counts = [int((regions == j).sum()) for j in range(P)]
            split = sum(c for j, c in enumerate(split_counts) if j != r)
            bal_msgs = []
            for d in range(P):
                a, b = max(lstart[r], bstart[d]), min(lstart[r] + g[r], bstart[d] + block[d])
                if d != r and b > a:
                    bal_msgs.append(b - a)
            balance = sum(bal_msgs)
            # the Bruck all-gather: at distance d the first min(d, P-d) blocks held (own first)
            bruck_blocks, d = [], 1
            while d < P:
                bruck_blocks += [block[(r + j) % P] for j in range(min(d, P - d))]
                d *= 2
            volumes.append({"split": split, "balance": balance, "allgather": sum(bruck_blocks)})
            control = lambda count: (P - 1) * (32 + 8 * count)  # noqa: E731  one allgather_int64
            b_ = control(P + 3) + control(2)                      # count table, reduced counts
            b_ += control(P) if repartition else 0                # counts after the repartition
            b_ += 4 * control(256) if radix else 0                # radix select passes
            b_ += sum(coo_message_bytes(c, n, itemsize) for j, c in enumerate(split_counts) if j != r and c)
            b_ += sum(coo_message_bytes(c, n, itemsize) for c in bal_msgs)
            b_ += sum(coo_message_bytes(c, n, itemsize) for c in bruck_blocks)
            nbytes.append(b_)
        self.step += 1
        return out, residuals, events, volumes, nbytes


# -- gradients -------------------------------------------------------------------------------
def gradient(pattern: str, n: int, size: int, rank: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7919 * step + 31 * rank + 5)
    if pattern == "random":
        return torch.randn(n, generator=gen)
    if pattern == "clustered":   # every rank's large entries in one narrow band that drifts
        g = torch.randn(n, generator=gen) * 0.01
        width = max(1, n // 16)
        lo = (step * width // 3 + rank * width // max(1, size)) % max(1, n - width)
        g[lo:lo + width] += torch.randn(width, generator=gen) * 10
        return g
    if pattern == "smooth":      # slowly changing gradients: the reused thresholds hold
        base = torch.randn(n, generator=torch.Generator().manual_seed(17 + rank))
        return base + 0.05 * torch.randn(n, generator=gen)
    if pattern == "decaying":    # a fixed direction whose size falls tenfold per step: residuals stay
        base = torch.randn(n, generator=torch.Generator().manual_seed(17 + rank))  # below the reused
        return base * 0.1 ** (step % 4) + 0.001 * torch.randn(n, generator=gen)     # thresholds
    if pattern == "ties":
        return torch.randint(-1, 2, (n,), generator=gen).float()
    if pattern == "zeros":
        return torch.zeros(n)
    raise ValueError(pattern)


def run_simulated(size, n, density, pattern, steps, options, dtype=torch.float32):
    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, **options)
        hist = []
        for step in range(steps):
            g = gradient(pattern, n, size, comm.rank, step).to(dtype)
            out = reducer(g.clone())
            alg = reducer.algorithm
            hist.append({"grad": g, "out": out.clone(), "residual": reducer.residual.clone(),
                         "volume": dict(alg.last_volume), "events": dict(alg.last_events),
                         "bytes": reducer.last_stats["bytes_sent"], "state": alg.state_dict()})
        return hist
    return simulate(size, fn).results


def check_against_reference(results, size, n, density, pattern, steps, tau, tau_prime, dtype=np.float32):
    k = ref_k(density, n)
    ref = RefOkTopk(size, n, k, tau, tau_prime, dtype)
    residuals = [np.zeros(n, dtype=dtype) for _ in range(size)]
    for step in range(steps):
        accs = [(residuals[r] + results[r][step]["grad"].numpy().astype(dtype)).astype(dtype) for r in range(size)]
        out, residuals, events, volumes, nbytes = ref.call(accs)
        for r in range(size):
            got = results[r][step]
            where = f"P={size} N={n} {pattern} step {step} rank {r}"
            assert np.array_equal(got["out"].numpy(), out), where + ": result"
            assert np.array_equal(got["residual"].numpy(), residuals[r]), where + ": residual"
            assert got["events"]["local_exact"] == events["local_exact"][r], where
            assert got["events"]["global_exact"] == events["global_exact"], where
            assert got["events"]["repartition"] == events["repartition"], where
            for phase in ("split", "balance", "allgather"):
                assert got["volume"][phase] == volumes[r][phase], (where, phase, got["volume"], volumes[r])
            assert got["bytes"] == nbytes[r], (where, got["bytes"], nbytes[r])
            st = got["state"]
            assert st["step"] == step + 1 and st["boundaries"] == ref.bounds, where
            assert st["global_threshold"] == ref.gt and st["local_threshold"] == ref.lt[r], where
            # the volume bound, every call (where it can hold: see bound_guaranteed)
            if bound_guaranteed(k, size):
                assert sum(volumes[r].values()) <= volume_bound(k, size), (where, volumes[r])
        # conservation: sum_r acc_r == out + sum_r residual_r (out's entries are float sums)
        lhs = np.sum([a.astype(np.float64) for a in accs], axis=0)
        rhs = out.astype(np.float64) + np.sum([e.astype(np.float64) for e in residuals], axis=0)
        np.testing.assert_allclose(rhs, lhs, rtol=0, atol=1e-5 * max(1.0, float(np.abs(lhs).max())) * size)


CASES = [  # (P, N, density, pattern, steps, tau, tau_prime)
    (1, 500, 0.02, "random", 5, 2, 3),
    (2, 1000, 0.05, "smooth", 9, 4, 3),
    (3, 1000, 0.05, "clustered", 8, 3, 4),
    (4, 2000, 0.01, "smooth", 10, 4, 5),
    (5, 1000, 0.02, "ties", 5, 2, 2),
    (6, 3001, 0.01, "random", 6, 3, 2),
    (7, 50, 0.5, "random", 4, 2, 3),
    (4, 1000, 1.0, "random", 3, 2, 2),       # k = N
    (3, 1, 0.01, "random", 3, 2, 2),         # N = 1
    (3, 1000, 0.01, "zeros", 3, 2, 2),
    (8, 1000, 0.02, "clustered", 4, 2, 3),
    (33, 2000, 0.01, "smooth", 3, 2, 2),
]


@pytest.mark.parametrize("size,n,density,pattern,steps,tau,tau_prime", CASES)
def test_matches_the_reference_on_simulated_ranks(size, n, density, pattern, steps, tau, tau_prime):
    results = run_simulated(size, n, density, pattern, steps, {"tau": tau, "tau_prime": tau_prime})
    check_against_reference(results, size, n, density, pattern, steps, tau, tau_prime)
    for step in range(steps):  # bit-identical on every rank (also implied by the reference)
        for r in range(1, size):
            assert torch.equal(results[r][step]["out"].view(torch.int32), results[0][step]["out"].view(torch.int32))


def test_float64_matches_the_reference():
    results = run_simulated(4, 1000, 0.03, "smooth", 6, {"tau": 3, "tau_prime": 2}, dtype=torch.float64)
    check_against_reference(results, 4, 1000, 0.03, "smooth", 6, 3, 2, dtype=np.float64)


def test_thresholds_are_reused_between_recomputations_and_repartition_follows_tau_prime():
    """With slowly changing gradients the thresholds are recomputed exactly at multiples of
    tau and reused in between; the boundaries change only at multiples of tau_prime."""
    tau, tau_prime, steps, size = 4, 6, 13, 4
    results = run_simulated(size, 4000, 0.01, "decaying", steps, {"tau": tau, "tau_prime": tau_prime})
    for r in range(size):
        local = [results[r][s]["events"]["local_exact"] for s in range(steps)]
        glob = [results[r][s]["events"]["global_exact"] for s in range(steps)]
        rep = [results[r][s]["events"]["repartition"] for s in range(steps)]
        assert rep == [s % tau_prime == 0 for s in range(steps)]
        assert [s for s in range(steps) if local[s]] == [s for s in range(steps) if s % tau == 0], local
        assert all(glob[s] for s in range(steps) if s % tau == 0)
        assert sum(glob) < steps, "the global threshold was never reused"
        thresholds = [results[r][s]["state"]["local_threshold"] for s in range(steps)]
        for s in range(1, steps):
            if s % tau:
                assert thresholds[s] == thresholds[s - 1], (r, s)
        bounds = [results[r][s]["state"]["boundaries"] for s in range(steps)]
        for s in range(1, steps):
            if s % tau_prime:
                assert bounds[s] == bounds[s - 1], (r, s)
        # the reused local selection varies in size (it is a threshold, not a top-k)
        selected = {results[r][s]["volume"]["selected"] for s in range(steps) if s % tau}
        assert len(selected) > 1 or selected != {ref_k(0.01, 4000)}
    check_against_reference(results, size, 4000, 0.01, "decaying", steps, tau, tau_prime)


@pytest.mark.parametrize("size", [2, 3, 4, 6])
def test_volume_stays_within_the_bound_with_clustered_gradients(size):
    """Over many steps of skewed gradients (all large entries in one drifting band, so the
    regions are unbalanced between repartitions and reused thresholds overshoot) no rank
    ever sends more than floor(6k(P-1)/P) entries in a call; the exact bytes follow."""
    n, density, steps = 2048, 0.02, 30
    results = run_simulated(size, n, density, "clustered", steps, {"tau": 8, "tau_prime": 16})
    k = ref_k(density, n)
    worst = 0
    for r in range(size):
        for s in range(steps):
            v = results[r][s]["volume"]
            assert v["entries"] == v["split"] + v["balance"] + v["allgather"]
            assert v["entries"] <= volume_bound(k, size), (r, s, v)
            assert v["global"] <= k and v["bound"] == volume_bound(k, size)
            worst = max(worst, v["entries"])
    assert worst > 0
    check_against_reference(results, size, n, density, "clustered", steps, 8, 16)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 33])
def test_local_cap_keeps_the_bound(size):
    """c_max + worst balance + worst Bruck all-gather (blocks of ceil(k/P)) <= 6k(P-1)/P for
    every k from P(P+1)/(3P-4) on; the cap is never below k."""
    for k in list(range(1, 300)) + [10**6 + 1]:
        cap = local_cap(k, size)
        worst = cap + (k - k // size) + (size - 1) * math.ceil(k / size)
        assert cap >= k
        assert bound_guaranteed(k, size) == (worst <= 6 * k * (size - 1) / size), (k, cap, worst)
        if k >= size * (size + 1) / (3 * size - 4):
            assert bound_guaranteed(k, size), k


def test_state_dict_round_trip_continues_identically():
    """Stopping after 5 calls, saving every rank's reducer state (residual, thresholds,
    boundaries, step) and continuing in fresh reducers gives the uninterrupted results."""
    size, n, steps, stop = 4, 1500, 10, 5
    options = {"tau": 3, "tau_prime": 4}

    def uninterrupted(comm):
        reducer = sc.SparseAllreduce("oktopk", 0.02, comm=comm, **options)
        return [reducer(gradient("smooth", n, size, comm.rank, s)).clone() for s in range(steps)]

    def resumed(comm):
        reducer = sc.SparseAllreduce("oktopk", 0.02, comm=comm, **options)
        outs = [reducer(gradient("smooth", n, size, comm.rank, s)).clone() for s in range(stop)]
        saved = pickle.dumps(reducer.state_dict())
        fresh = sc.SparseAllreduce("oktopk", 0.02, comm=comm, **options)
        fresh.load_state_dict(pickle.loads(saved))
        outs += [fresh(gradient("smooth", n, size, comm.rank, s)).clone() for s in range(stop, steps)]
        return outs, pickle.loads(saved)["algorithm_state"]

    def restarted(comm):  # the same without the algorithm state: the run differs
        reducer = sc.SparseAllreduce("oktopk", 0.02, comm=comm, **options)
        outs = [reducer(gradient("smooth", n, size, comm.rank, s)).clone() for s in range(stop)]
        st = reducer.state_dict()
        fresh = sc.SparseAllreduce("oktopk", 0.02, comm=comm, **options)
        fresh.load_state_dict({**st, "algorithm_state": {}})
        return outs + [fresh(gradient("smooth", n, size, comm.rank, s)).clone() for s in range(stop, steps)]

    want = simulate(size, uninterrupted).results
    got = simulate(size, resumed).results
    other = simulate(size, restarted).results
    for r in range(size):
        outs, state = got[r]
        assert state["step"] == stop and len(state["boundaries"]) == size + 1
        for s in range(steps):
            assert torch.equal(outs[s], want[r][s]), (r, s)
        assert any(not torch.equal(other[r][s], want[r][s]) for s in range(stop, steps))


def test_ranks_with_different_state_raise_the_same_error():
    """Only rank 0 loads a checkpoint: every rank raises the same ValueError before any
    entry moves, and the residuals stay as they were."""
    size, n = 3, 600

    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", 0.05, comm=comm, tau=2, tau_prime=2)
        for s in range(3):
            reducer(gradient("random", n, size, comm.rank, s))
        if comm.rank == 0:
            reducer.algorithm.load_state_dict({**reducer.algorithm.state_dict(), "step": 1})
        before = reducer.residual.clone()
        g = gradient("random", n, size, comm.rank, 9)
        try:
            reducer(g.clone())
        except ValueError as exc:
            return str(exc), torch.equal(reducer.residual, before + g)
        return None, None

    results = simulate(size, fn).results
    messages = {m for m, _ in results}
    assert len(messages) == 1 and None not in messages, results
    assert all(untouched for _, untouched in results), "a residual changed in the refused call"
    assert "disagree on their state" in messages.pop()


@pytest.mark.parametrize("options,message", [
    ({"tau": 0}, r"tau must be an integer number of steps in \[1, 2\^31 - 1\], got 0"),
    ({"tau": 2.0}, r"tau must be .* got 2\.0"),
    ({"tau": True}, r"tau must be .* got True"),
    ({"tau_prime": -1}, r"tau_prime must be .* got -1"),
    ({"tau_prime": None}, r"tau_prime must be .* got None"),
    ({"tau_prime": 2**31}, r"tau_prime must be .* got 2147483648"),
])
def test_bad_options_raise_clear_value_errors(options, message):
    with pytest.raises(ValueError, match=rf"^oktopk: {message}"):
        sc.algorithms.get("oktopk")(None, **options)
    with pytest.raises(ValueError, match=message):
        sc.DDPHookState("oktopk", 0.01, **options)


def test_bad_state_is_refused():
    alg = sc.algorithms.get("oktopk")(None)
    good = {"n": 10, "k": 1, "size": 2, "step": 3, "local_threshold": 0.5, "global_threshold": None,
            "boundaries": [0, 4, 10]}
    alg.load_state_dict(good)
    assert alg.state_dict() == good
    for bad, message in [({"boundaries": [0, 5, 4]}, "boundaries"), ({"boundaries": [0, 10]}, "boundaries"),
                         ({"step": -1}, "integers"), ({"local_threshold": math.nan}, "local_threshold"),
                         ({"size": 0}, "integers")]:
        with pytest.raises(ValueError, match=message):
            alg.load_state_dict({**good, **bad})
    with pytest.raises(ValueError, match="unknown keys"):
        alg.load_state_dict({**good, "h": 1})


# -- gloo ranks ------------------------------------------------------------------------------
GLOO = [(1000, 0.02, "smooth", 5, 2, 3), (777, 0.05, "clustered", 4, 3, 2)]


def _gloo_rank(rank, world_size):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    runs = []
    for n, density, pattern, steps, tau, tau_prime in GLOO:
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=tau, tau_prime=tau_prime)
        hist = []
        for step in range(steps):
            g = gradient(pattern, n, world_size, rank, step)
            out = reducer(g.clone())
            alg = reducer.algorithm
            hist.append({"grad": g.numpy(), "out": out.numpy(), "residual": reducer.residual.numpy().copy(),
                         "volume": dict(alg.last_volume), "events": dict(alg.last_events),
                         "bytes": reducer.last_stats["bytes_sent"], "state": alg.state_dict()})
        runs.append(hist)
    return runs


@pytest.mark.parametrize("size", range(1, 7))
def test_matches_the_reference_on_gloo_ranks(size):
    runs = spawn(_gloo_rank, size, timeout=180)
    for case, (n, density, pattern, steps, tau, tau_prime) in enumerate(GLOO):
        results = [[{**h, "grad": torch.from_numpy(h["grad"]), "out": torch.from_numpy(h["out"]),
                     "residual": torch.from_numpy(h["residual"])} for h in runs[r][case]] for r in range(size)]
        check_against_reference(results, size, n, density, pattern, steps, tau, tau_prime)


# -- through the DDP hook's checkpoint ---------------------------------------------------------
def _hook_worker(rank, world_size, resume_at):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():  # one parameter: DDP's rebuilt bucket has the initial layout, so the state continues
        torch.manual_seed(0)
        return nn.Linear(64, 32, bias=False)

    gen = torch.Generator().manual_seed(5 + rank)
    x, y = torch.randn(128, 64, generator=gen), torch.randint(0, 32, (128,), generator=gen)
    state = sc.DDPHookState("oktopk", 0.05, tau=2, tau_prime=3, async_comm=False)
    net = DDP(model(), bucket_cap_mb=0.002)
    net.register_comm_hook(state, sc.ddp_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    grads, kept = [], None
    for step in range(8):
        if step == resume_at:
            saved = pickle.dumps(state)
            kept = [st["step"] for st in state.local_state_dict()["algorithm_states"].values()]
            weights = net.module.state_dict()
            state = pickle.loads(saved)
            net = DDP(model(), bucket_cap_mb=0.002)
            net.module.load_state_dict(weights)
            net.register_comm_hook(state, sc.ddp_hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy().copy())
        opt.step()
    return grads, kept


def test_hook_checkpoint_carries_the_algorithm_state():
    """A DDP run checkpointed (pickled hook state) after 5 steps and resumed in a fresh model
    reduces exactly the gradients of the uninterrupted run: thresholds, boundaries and steps
    travel in the hook's state_dict, one per bucket of the hook's plan (its recorded bucket
    layout, see sparsecomm/hook.py)."""
    plain = spawn(_hook_worker, 2, -1, timeout=180)
    resumed = spawn(_hook_worker, 2, 5, timeout=180)
    for r in range(2):
        assert resumed[r][1] == [5], resumed[r][1]  # one bucket, 5 calls
        for step, (a, b) in enumerate(zip(plain[r][0], resumed[r][0])):
            assert np.array_equal(a, b), (r, step)


# -- the control all-gather ------------------------------------------------------------------
def test_allgather_int64_gives_every_rank_the_table_and_checks_headers(monkeypatch):
    from sparsecomm.comm.collectives import allgather_int64
    from sparsecomm.comm.simulated import SimComm
    from sparsecomm.errors import WireFormatError

    def fn(comm):
        return allgather_int64(comm, [comm.rank, -comm.rank, 2**40 + comm.rank], 77)

    for size in (1, 2, 5, 8):
        want = torch.tensor([[r, -r, 2**40 + r] for r in range(size)])
        for table in simulate(size, fn).results:
            assert torch.equal(table, want)
    post = SimComm._post_and_wait

    def corrupt(self, sends, recvs):  # rank 1 announces another N in its header
        if self.rank == 1:
            sends = [(peer, payload.clone()) for peer, payload in sends]
            for _, payload in sends:
                payload[16] ^= 1
        return post(self, sends, recvs)

    monkeypatch.setattr(SimComm, "_post_and_wait", corrupt)

    def checked(comm):
        try:
            allgather_int64(comm, [1, 2], 77)
        except WireFormatError as exc:
            return str(exc)
        return None

    messages = simulate(2, checked).results
    assert messages[1] is None and "rank 1" in messages[0], messages
