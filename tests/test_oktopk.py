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

import math  # noqa: F401
import pickle

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

from _reference import coo_message_bytes, ref_k, ref_topk_indices


# -- the reference ---------------------------------------------------------------------------
REF_RUNGS = 48  # rungs on each side of a reused threshold, 1/128 octave apart (2^16 in float32 bits)


def ref_ladder(t: float) -> np.ndarray:
    """The rungs of a reused threshold as float32 values, ascending: float32 bit patterns
    key(t) + j * 2^16 for j = -48..48, clamped to [0, +inf]."""
    key = int(np.array([t], dtype=np.float32).view(np.int32)[0])
    keys = [min(max(key + j * (1 << 16), 0), 0x7F800000) for j in range(-REF_RUNGS, REF_RUNGS + 1)]
    return np.array(keys, dtype=np.int32).view(np.float32)


def ref_pick(counts: list[int], k: int):
    """The rung selecting the most entries without exceeding k, if that is at least 2k/3."""
    fitting = [j for j in range(len(counts)) if counts[j] <= k]
    if not fitting or 3 * counts[fitting[0]] < 2 * k:
        return None
    return fitting[0]


def ref_volume_bound(k: int, size: int) -> int:
    """floor(6k(P-1)/P) entries: the bound held in every case (twice the paper's)."""
    return (6 * k * (size - 1)) // size


def ref_paper_bound(k: int, size: int) -> int:
    """The paper's 6k(P-1)/P words per rank, an entry being two words: floor(3k(P-1)/P) entries."""
    return (3 * k * (size - 1)) // size


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
                rungs = ref_ladder(self.lt[r])
                j = ref_pick([int((np.abs(acc) >= v.astype(self.dtype)).sum()) for v in rungs], k)
                if j is not None:
                    sel = np.nonzero(np.abs(acc) >= rungs[j].astype(self.dtype))[0]
                    self.lt[r] = float(rungs[j])
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
        reuse = self.gt is not None and step % self.tau != 0
        if reuse and all_idx.size <= k:
            keep = np.ones(all_idx.size, dtype=bool)          # everything; the threshold stays
        elif reuse:
            rungs = ref_ladder(self.gt)
            j = ref_pick([int((keys >= v).sum()) for v in rungs], k)
            if j is not None:
                keep = keys >= rungs[j]
                self.gt = float(rungs[j])
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
            b_ = control(P + 3) + control(1 + (2 * REF_RUNGS + 1 if reuse else 0))  # count table, reduced counts
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
            # the bound held in every case, wherever it can hold: k(3P-4) >= P(P+1)
            if k * (3 * size - 4) >= size * (size + 1):
                assert sum(volumes[r].values()) <= ref_volume_bound(k, size), (where, volumes[r])
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


def _key(t: float) -> int:
    return int(np.array([t], dtype=np.float32).view(np.int32)[0])


def check_counts_near_k(results, size, k, steps, tau):
    """Every call: the local selection holds k entries on recomputation, between 2k/3 and k
    otherwise; the global count G is at most k, and at least 2k/3 unless fewer candidates
    were reduced (then all of them, up to k)."""
    for r in range(size):
        for s in range(steps):
            v, ev = results[r][s]["volume"], results[r][s]["events"]
            c, g, m = v["selected"], v["global"], v["candidates"]
            if ev["local_exact"]:
                assert c == k, (r, s, v)
            assert 3 * c >= 2 * k and c <= k, (r, s, v)
            assert g <= k and 3 * g >= 2 * min(k, m) and (g == m or m > k), (r, s, v)
            if s % tau == 0:
                assert ev["local_exact"] and ev["global_exact"], (r, s, ev)


def test_thresholds_follow_the_schedule_and_move_along_the_ladder_in_between():
    """Thresholds are recomputed exactly at multiples of tau; in between each is reused and
    moved to the rung of its ladder (float32 bit pattern +- j * 2^16, |j| <= 48) whose count
    is the largest not above k. With magnitudes that fall tenfold per step a fixed threshold
    would select ever fewer entries: the counts stay within [2k/3, k] instead. The boundaries
    change only at multiples of tau_prime."""
    tau, tau_prime, steps, size, n, density = 4, 6, 13, 4, 4000, 0.01
    results = run_simulated(size, n, density, "decaying", steps, {"tau": tau, "tau_prime": tau_prime})
    k = ref_k(density, n)
    check_counts_near_k(results, size, k, steps, tau)
    moved = reused = 0
    for r in range(size):
        rep = [results[r][s]["events"]["repartition"] for s in range(steps)]
        assert rep == [s % tau_prime == 0 for s in range(steps)]
        for name, event in (("local_threshold", "local_exact"), ("global_threshold", "global_exact")):
            for s in range(1, steps):
                if results[r][s]["events"][event]:
                    continue
                reused += 1
                before, after = results[r][s - 1]["state"][name], results[r][s]["state"][name]
                step = _key(after) - _key(before)
                assert step % (1 << 16) == 0 and abs(step) <= 48 << 16, (r, s, name, before, after)
                moved += step != 0
        bounds = [results[r][s]["state"]["boundaries"] for s in range(steps)]
        for s in range(1, steps):
            if s % tau_prime:
                assert bounds[s] == bounds[s - 1], (r, s)
    assert reused > 0 and moved > 0, (reused, moved)
    check_against_reference(results, size, n, density, "decaying", steps, tau, tau_prime)


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
            assert v["entries"] <= ref_volume_bound(k, size), (r, s, v)
            assert v["bound"] == ref_volume_bound(k, size) and v["paper_bound"] == ref_paper_bound(k, size)
            worst = max(worst, v["entries"])
    assert worst > 0
    check_counts_near_k(results, size, k, steps, 8)
    check_against_reference(results, size, n, density, "clustered", steps, 8, 16)


@pytest.mark.parametrize("size", [4, 6])
def test_the_papers_bound_holds_and_the_counts_stay_near_k_with_the_default_periods(size):
    """The paper's bound, 6k(P-1)/P words = floor(3k(P-1)/P) (index, value) entries per rank,
    in at least 99% of the calls over 64 steps of clustered gradients with tau = 32 and
    tau' = 64; the global count G has a median of at least 0.9 k."""
    n, density, steps = 4096, 0.01, 64
    results = run_simulated(size, n, density, "clustered", steps, {})
    k = ref_k(density, n)
    entries = [results[r][s]["volume"]["entries"] for r in range(size) for s in range(steps)]
    over = sum(e > ref_paper_bound(k, size) for e in entries)
    assert over <= 0.01 * len(entries), (over, len(entries), max(entries), ref_paper_bound(k, size))
    check_counts_near_k(results, size, k, steps, 32)
    assert np.median([results[0][s]["volume"]["global"] for s in range(steps)]) >= 0.9 * k


def test_ties_between_two_rungs_fall_back_to_the_exact_top_k():
    """When no rung selects between 2k/3 and k (here 4 entries at the threshold, then 20 tied
    just below it, within one rung), the reused threshold is not taken: the exact top-k runs
    at that step (ties to the lower index), so the update still holds k entries."""
    n, density = 1000, 0.01
    k = ref_k(density, n)
    assert k == 10
    g0 = torch.zeros(n)
    g0[:k] = 5.0                    # step 0: exactly k entries, threshold 5
    g1 = torch.zeros(n)
    g1[100:104] = 5.0               # step 1: 4 at the threshold (fewer than 2k/3) ...
    g1[200:220] = 4.99              # ... and 20 between it and the next rung down (0.54% lower)

    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=100, tau_prime=100)
        reducer(g0.clone())
        out = reducer(g1.clone()).clone()
        return out, dict(reducer.algorithm.last_volume), dict(reducer.algorithm.last_events)

    for size in (1, 2):
        out, volume, events = simulate(size, fn).results[0]
        assert events["local_exact"] and volume["selected"] == k, (size, volume, events)
        want = torch.zeros(n)
        want[100:104] = 5.0 * size
        want[200:206] = 4.99 * size
        assert torch.equal(out, want), size


def test_reduced_ties_between_two_rungs_fall_back_to_the_exact_global_selection():
    """The global rule's band: 4 reduced sums at the global threshold (5) and 16 tied just
    below it, within one rung. No rung selects between 2k/3 and k, so the exact selection runs
    (G = k, ties to the lower index) instead of passing 4 entries."""
    n, density = 1000, 0.01
    k = ref_k(density, n)

    def grad(rank, step):
        g = torch.zeros(n)
        if step == 0:   # rank 0's k entries of 5 win: global threshold 5
            g[rank * k:(rank + 1) * k] = 5.0 if rank == 0 else 1.0
        elif rank == 0:
            g[100:104] = 5.0
            g[200:206] = 4.99
        else:
            g[206:216] = 4.99
        return g

    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=100, tau_prime=100)
        reducer(grad(comm.rank, 0))
        out = reducer(grad(comm.rank, 1)).clone()
        return out, dict(reducer.algorithm.last_volume), dict(reducer.algorithm.last_events)

    want = torch.zeros(n)
    want[100:104] = 5.0
    want[200:206] = 4.99
    for out, volume, events in simulate(2, fn).results:
        assert volume["candidates"] == 20 and volume["global"] == k and events["global_exact"], (volume, events)
        assert torch.equal(out, want)


def test_few_candidates_are_all_taken_and_the_global_threshold_stays():
    """A reuse step whose reduced candidates are at most k takes every one of them without an
    exact selection, and keeps the global threshold for the next steps, even when they all lie
    below its ladder (sums of 2 under a threshold of 5)."""
    n, density = 1000, 0.01
    k = ref_k(density, n)

    def grad(rank, step):
        g = torch.zeros(n)
        if step == 0:   # rank 0's k entries of 5 win the exact selection; rank 1 keeps its 1.5s
            g[rank * k:(rank + 1) * k] = 5.0 if rank == 0 else 1.5
        elif rank == 0:  # both ranks now select k..2k-1 (rank 1 from its residual)
            g[k:2 * k] = 0.5
        return g

    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=100, tau_prime=100)
        reducer(grad(comm.rank, 0))
        out = reducer(grad(comm.rank, 1)).clone()
        alg = reducer.algorithm
        return out, dict(alg.last_volume), dict(alg.last_events), alg.state_dict()["global_threshold"]

    want = torch.zeros(n)
    want[k:2 * k] = 2.0
    for out, volume, events, threshold in simulate(2, fn).results:
        assert torch.equal(out, want)
        assert volume["candidates"] == volume["global"] == k and not events["global_exact"], (volume, events)
        assert threshold == 5.0


def test_a_band_that_jumps_regions_meets_the_bound_in_the_worst_split():
    """The large entries of every rank move at step 1 from the first region to the last,
    where the boundaries (fixed until tau_prime) give them to one owner: ranks 0..P-2 send
    their whole selection (k entries) in the split, the owner balances G - floor(G/P) entries,
    and no rank sends more than floor(6k(P-1)/P); the result holds the band's top-k sums."""
    size, n, density = 4, 2000, 0.02
    k = ref_k(density, n)

    def grad(rank, step):
        g = torch.randn(n, generator=torch.Generator().manual_seed(3 + rank + 10 * step)) * 1e-3
        lo = 0 if step == 0 else n - 4 * k
        g[lo:lo + 4 * k] += torch.linspace(1, 2, 4 * k) * (1 + rank)
        return g

    def fn(comm):
        reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=1, tau_prime=8)  # exact top-k
        outs, vols = [], []
        for step in range(2):
            outs.append(reducer(grad(comm.rank, step)).clone())
            vols.append(dict(reducer.algorithm.last_volume))
        return outs, vols

    results = simulate(size, fn).results
    for r in range(size):
        v = results[r][1][1]
        assert v["entries"] <= ref_volume_bound(k, size), (r, v)
        if r < size - 1:
            assert v["split"] == k, (r, v)
    owner = results[size - 1][1][1]
    assert owner["global"] == k and owner["balance"] == k - k // size, owner
    out = results[0][0][1]  # the step's band summed over the ranks: its k largest are at its top
    assert torch.equal(torch.nonzero(out).view(-1), torch.arange(n - k, n))


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
    travel in the hook's state_dict, one per bucket of the hook's recorded bucket layout
    (sparsecomm/hooks/bucket_layout.py)."""
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
