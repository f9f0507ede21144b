"""SparDL (docs/spardl.md) against a plain numpy reference of the paper's algorithm.

The reference below simulates all P ranks with dense numpy arrays, written from the paper
(sections 3.1-3.3, Algorithms 1 and 2) and the choices documented in
``sparsecomm/algorithms/spardl.py`` (quota ceil(k/Q) per block, ties to the lower index,
teams of consecutive ranks, zero padding of short B-SAG blocks, shares of discarded values).
It knows nothing of the implementation's journal, runs or message code: it keeps one dense
working copy per rank and applies Algorithm 1's rule (xi at the result's indices, the
original elsewhere) at the end. Bytes are counted from the message layout
(header 32 B + int32 indices padded to 8 B + values), rounds from the schedule, and both are
also checked against the closed forms of the paper's Table 1 and equation (7).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

from _reference import coo_message_bytes, make_gradients, ref_k

# --------------------------------------------------------------------------- reference


def np_topk(x: np.ndarray, m: int) -> np.ndarray:
    """Positions of the m largest |x|, ties to the lower position, ascending."""
    mags = np.abs(x)
    order = np.lexsort((np.arange(mags.size), -mags))
    return np.sort(order[:m])


def ref_layout(size, teams):
    if teams is None:
        teams = 2 if size >= 4 and size % 2 == 0 else 1
    return teams


def ref_mode(teams, sag):
    if teams == 1:
        return "none"
    if sag == "recursive" or (sag == "auto" and teams & (teams - 1) == 0):
        return "recursive"
    return "bruck"


def new_hstate(size, k, d):
    return {"h": k / size, "step": 0.01 * k * (d - 1) / size, "flag": False}


def update_hstate(st, n_t, target, size, k, d):
    """Algorithm 2, lines 3-12 (plus the documented clamps)."""
    step, flag = st["step"], st["flag"]
    if (n_t > target) != (step > 0):
        if flag:
            step, flag = step * 2, False
        else:
            flag = True
    else:
        step, flag = -step / 2, False
    width = k * (d - 1) / size
    step = max(-width, min(width, step))
    st["step"], st["flag"] = step, flag
    st["h"] = max(k / size, min(d * k / size, st["h"] + step))


def ref_spardl(accs, k, teams, mode, hstates, itemsize=8):
    """One SparDL call on all ranks. Returns (out, residuals, bytes sent per rank, rounds)."""
    size, n = len(accs), accs[0].size
    d = teams
    q = size // d
    c = -(-k // q)
    bounds = [b * n // q for b in range(q + 1)]
    cnt = [min(c, bounds[b + 1] - bounds[b]) for b in range(q)]
    W = [a.astype(np.float64).copy() for a in accs]
    sent = [0] * size
    rounds = 0

    def select(r, blocks, quota):
        parts = [bounds[b] + np_topk(W[r][bounds[b]:bounds[b + 1]], quota) for b in sorted(blocks)]
        idx = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        vals = W[r][idx].copy()
        W[r][idx] = 0.0
        return idx, vals

    # Spar-Reduce-Scatter: bags of blocks in a circle, sent from the last bag to the first
    levels = math.ceil(math.log2(q)) if q > 1 else 0
    for i in range(1, levels + 1):
        dist = 2 ** (levels - i)
        msgs = []
        for r in range(size):
            t, p = divmod(r, q)
            bag = [(p + o) % q for o in range(dist, min(2 * dist, q))]   # B_(l-i+1)
            idx, vals = select(r, bag, c)
            msgs.append((t * q + (p + dist) % q, idx, vals))
            sent[r] += coo_message_bytes(idx.size, n, itemsize)
        for dest, idx, vals in msgs:
            W[dest][idx] += vals
        rounds += 1

    # final selection of the preserved block (top-h for B-SAG)
    F = {}
    for r in range(size):
        p = r % q
        quota = c
        if mode == "bruck":
            quota = min(cnt[p], max(1, math.ceil(hstates[r]["h"] - 1e-9)))
            if cnt[p] == bounds[p + 1] - bounds[p]:
                quota = cnt[p]      # whole block selected (dense input): send it all
        F[r] = select(r, [p], quota)

    if mode == "recursive":
        for s in range(int(math.log2(d))):
            new = {}
            for r in range(size):
                t, p = divmod(r, q)
                partner = (t ^ (1 << s)) * q + p
                a, b = (F[r], F[partner]) if not t & (1 << s) else (F[partner], F[r])
                ui = np.union1d(a[0], b[0])
                uv = np.zeros(ui.size)
                uv[np.searchsorted(ui, a[0])] += a[1]
                uv[np.searchsorted(ui, b[0])] += b[1]
                keep = np_topk(uv, cnt[p])
                drop = np.setdiff1d(np.arange(ui.size), keep)
                W[r][ui[drop]] += uv[drop] * (1.0 / (2 << s))
                new[r] = (ui[keep], uv[keep])
                sent[r] += coo_message_bytes(cnt[p], n, itemsize)
            F = new
            rounds += 1
    elif mode == "bruck":
        new = {}
        for r in range(size):
            t, p = divmod(r, q)
            group = [tt * q + p for tt in range(d)]
            ui = np.unique(np.concatenate([F[g][0] for g in group]))
            uv = np.zeros(ui.size)
            for g in group:
                uv[np.searchsorted(ui, F[g][0])] += F[g][1]
            target = cnt[p]
            if ui.size >= target:
                keep = np_topk(uv, target)
                drop = np.setdiff1d(np.arange(ui.size), keep)
                W[r][ui[drop]] += uv[drop] * (1.0 / d)
                new[r] = (ui[keep], uv[keep])
            else:
                free = [j for j in range(bounds[p], bounds[p + 1]) if j not in set(ui.tolist())]
                pad = np.array(free[: target - ui.size], dtype=np.int64)
                allidx = np.concatenate([ui, pad])
                allval = np.concatenate([uv, np.zeros(pad.size)])
                order = np.argsort(allidx)
                new[r] = (allidx[order], allval[order])
            sent[r] += (d - 1) * coo_message_bytes(F[r][0].size, n, itemsize)
            update_hstate(hstates[r], ui.size, target, size, k, d)
        F = new
        rounds += math.ceil(math.log2(d))

    # Bruck all-gather inside each team; every team must produce the same vector
    outs = []
    for t in range(d):
        out = np.zeros(n)
        for p in range(q):
            idx, vals = F[t * q + p]
            assert idx.size == cnt[p]
            out[idx] = vals
        outs.append(out)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])   # the reference's own consistency
    for r in range(size):   # Bruck: at distance 2^s a rank sends the blocks of positions p .. p+count-1
        p, dist = r % q, 1
        while dist < q:
            sent[r] += sum(coo_message_bytes(cnt[(p + j) % q], n, itemsize) for j in range(min(dist, q - dist)))
            dist *= 2
    rounds += math.ceil(math.log2(q)) if q > 1 else 0
    I = np.unique(np.concatenate([F[r][0] for r in range(q)]))
    residuals = []
    for r in range(size):
        res = accs[r].astype(np.float64).copy()
        res[I] = W[r][I]
        residuals.append(res)
    return outs[0], residuals, sent, rounds


# --------------------------------------------------------------------------- harness

STEPS = 4


def rank_history(comm, density, grads_by_step, options):
    reducer = sc.SparseAllreduce("spardl", density, comm=comm, **options)
    history = []
    for grads in grads_by_step:
        out = reducer(grads[comm.rank].clone())
        assert out.dtype == grads[comm.rank].dtype
        # half outputs go back as float64 (exact widening; numpy has no bfloat16)
        out_np = out.double().numpy() if out.dtype in (torch.float16, torch.bfloat16) else out.clone().numpy()
        history.append((out_np, reducer.residual.clone().numpy(), dict(reducer.last_stats)))
    return history


def check_case(size, n, density, pattern, options, results=None, dtype=torch.float64, steps=STEPS, seed=0):
    grads_by_step = [make_gradients(pattern, n, size, step, dtype, seed) for step in range(steps)]
    if results is None:
        results = simulate(size, lambda comm: rank_history(comm, density, grads_by_step, options)).results
    k = ref_k(density, n)
    teams = ref_layout(size, options.get("teams"))
    mode = ref_mode(teams, options.get("sag", "auto"))
    itemsize = torch.empty((), dtype=dtype).element_size()
    hstates = [new_hstate(size, k, teams) for _ in range(size)]
    carried = [np.zeros(n) for _ in range(size)]
    for step, grads in enumerate(grads_by_step):
        outs = [results[r][step][0] for r in range(size)]
        res = [results[r][step][1].astype(np.float64) for r in range(size)]
        stats = [results[r][step][2] for r in range(size)]
        # 1. consistency: bit-identical on every rank
        for r in range(1, size):
            assert np.array_equal(outs[r], outs[0]), f"step {step}: rank {r} differs from rank 0"
        # 2. conservation: sum_r (g_r + e_r) == out + sum_r e'_r
        total_in = sum(grads[r].double().numpy() + carried[r] for r in range(size))
        total_out = outs[0].astype(np.float64) + sum(res)
        scale = max(1.0, float(np.abs(total_in).max()) if n else 1.0)
        ctol = 1e-12 if dtype == torch.float64 else 1e-5
        np.testing.assert_allclose(total_out, total_in, rtol=0, atol=ctol * scale * size,
                                   err_msg=f"conservation, step {step}")
        # 3. the paper's algorithm, step by step (float64: same arithmetic, same order)
        accs = [(grads[r].double().numpy() + carried[r]) if dtype == torch.float64 else
                (torch.from_numpy(carried[r]).to(dtype) + grads[r]).double().numpy() for r in range(size)]
        want_out, want_res, want_bytes, want_rounds = ref_spardl(accs, k, teams, mode, hstates, itemsize)
        if dtype == torch.float64:
            np.testing.assert_allclose(outs[0], want_out, rtol=1e-12, atol=1e-12 * scale,
                                       err_msg=f"out, step {step}")
            for r in range(size):
                np.testing.assert_allclose(res[r], want_res[r], rtol=1e-12, atol=1e-12 * scale,
                                           err_msg=f"residual of rank {r}, step {step}")
        # 4. rounds and bytes per rank from the message layout
        for r in range(size):
            assert stats[r]["rounds"] == want_rounds, (step, r, stats[r]["rounds"], want_rounds)
            assert stats[r]["bytes_sent"] == want_bytes[r], (step, r, stats[r]["bytes_sent"], want_bytes[r])
        carried = res   # the next step starts from what the implementation carried
    return results


# --------------------------------------------------------------------------- simulated sweeps

SIM_CASES = [  # (P, N, density, pattern, options)
    (12, 4099, 0.01, "random", {}),                               # default: R-SAG, 2 teams
    (12, 4099, 0.01, "random", {"teams": 1}),                     # no SAG, non-power-of-two
    (12, 4099, 0.02, "overlap", {"teams": 3}),                    # B-SAG (auto), d = 3
    (12, 4099, 0.02, "disjoint", {"teams": 4, "sag": "bruck"}),   # B-SAG with d a power of two
    (16, 4096, 0.01, "random", {"teams": 4}),                     # R-SAG, d = 4 (quarter shares)
    (16, 2053, 0.05, "ties", {"teams": 16}),                      # one rank per team: pure SAG
    (24, 3001, 0.01, "random", {"teams": 8, "sag": "recursive"}),
    (24, 3001, 0.01, "disjoint", {"teams": 6}),
    (33, 2053, 0.02, "random", {}),                               # odd P: no SAG by default
    (33, 2053, 0.02, "overlap", {"teams": 3}),
    (33, 20, 0.1, "random", {"teams": 11}),                       # N < P, tiny blocks
    (5, 3, 0.5, "random", {}),                                    # N < P
    (7, 1, 1.0, "random", {}),                                    # N = 1
    (6, 1025, 1.0, "random", {}),                                 # dense input
    (6, 1025, 0.01, "zeros", {"teams": 3}),                       # all-zero input, B-SAG padding
    (8, 1000, 0.01, "zeros", {}),
]


@pytest.mark.parametrize("size,n,density,pattern,options", SIM_CASES)
def test_simulated_against_reference(size, n, density, pattern, options):
    check_case(size, n, density, pattern, options)


@pytest.mark.parametrize("size,options", [(12, {}), (6, {"teams": 3}), (8, {"teams": 1})])
def test_float32_invariants(size, options):
    check_case(size, 3001, 0.01, "random", options, dtype=torch.float32)


def test_dense_input_is_exact():
    """density 1.0: every block travels whole, the result is the exact sum, residuals are 0."""
    for size, options in [(6, {}), (5, {}), (6, {"teams": 3}), (8, {"teams": 4})]:
        n = 1001
        grads = make_gradients("random", n, size, 0, torch.float64)
        results = simulate(size, lambda comm: rank_history(comm, 1.0, [grads], options)).results
        exact = sum(g.numpy() for g in grads)
        for r in range(size):
            np.testing.assert_allclose(results[r][0][0], exact, rtol=1e-12, atol=1e-12)
            assert np.all(results[r][0][1] == 0)


def test_zero_input_gives_zero():
    results = simulate(6, lambda comm: rank_history(comm, 0.01, [[torch.zeros(777)] * 6] * 2, {})).results
    for r in range(6):
        for out, res, stats in results[r]:
            assert not out.any() and not res.any()
            assert stats["nnz_out"] == 0


# --------------------------------------------------------------------------- cost vs Table 1

@pytest.mark.parametrize("size,teams,sag", [(2, 1, "auto"), (3, 1, "auto"), (6, 1, "auto"), (8, 1, "auto"),
                                            (8, 2, "auto"), (8, 4, "auto"), (16, 4, "auto"), (12, 2, "auto"),
                                            (6, 3, "bruck"), (12, 3, "bruck"), (8, 4, "bruck")])
def test_cost_against_table_1(size, teams, sag):
    """Rounds and entries sent per rank against the closed forms of Table 1 / eq. (7).

    N and k are chosen so that every block carries exactly k/Q entries (an even number, so
    the int32 index section needs no padding); bytes = messages * 32 + entries * (4 + 8).
    """
    q = size // teams
    n = 2 * 3 * 5 * 7 * 16 * 12   # divisible by every Q used here
    k = 40 * size                 # k/Q = 40*teams entries per block, even
    density = k / n
    grads = [make_gradients("random", n, size, s, torch.float64) for s in range(3)]
    results = simulate(size, lambda comm: rank_history(comm, density, grads,
                                                       {"teams": teams, "sag": sag})).results
    log_q = math.ceil(math.log2(q)) if q > 1 else 0
    for r in range(size):
        for step in range(3):
            stats = results[r][step][2]
            assert stats["k"] == k
            if teams == 1:
                assert stats["rounds"] == 2 * math.ceil(math.log2(size))
                messages = log_q + (q - 1)
                entries = 2 * k * (size - 1) / size                 # Table 1: 4k(P-1)/P beta (idx+val)
                assert stats["bytes_sent"] == messages * 32 + entries * 12
            elif sag == "auto" and teams & (teams - 1) == 0:    # R-SAG
                assert stats["rounds"] == 2 * log_q + int(math.log2(teams))
                messages = log_q + int(math.log2(teams)) + (q - 1)
                entries = k * (2 * size - 2 * teams) / size + teams * k / size * math.log2(teams)
                assert stats["bytes_sent"] == messages * 32 + entries * 12
            else:                                               # B-SAG: within the bounds of eq. (7)
                assert stats["rounds"] == 2 * log_q + math.ceil(math.log2(teams))
                messages = log_q + (teams - 1) + (q - 1)
                entries_bytes = stats["bytes_sent"] - messages * 32
                lower = k * (teams ** 2 + size - 2 * teams) / (size * teams)
                upper = k * (teams ** 2 + 2 * size - 3 * teams) / size
                # indices are padded to 8 B per message: at most 4 bytes per message
                assert lower * 12 <= entries_bytes <= upper * 12 + 4 * messages, (entries_bytes, lower, upper)


# --------------------------------------------------------------------------- gloo ranks

def _gloo_rank(rank, world_size, cases):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    return [rank_history(comm, density, grads_by_step, options) for density, grads_by_step, options in cases]


def gloo_cases(size):
    cases = [(1025, 0.02, "random", {}),                        # default teams for this P
             (1001, 0.05, "disjoint", {"teams": 1}),            # no SAG, N not divisible by P
             (size - 1 if size > 1 else 1, 1.0, "random", {})]  # N < P, dense
    if size % 2 == 0 and size >= 2:
        cases.append((999, 0.03, "overlap", {"teams": 2, "sag": "recursive"}))
    if size % 3 == 0:
        cases.append((999, 0.03, "random", {"teams": 3}))      # B-SAG
    return cases


@pytest.mark.parametrize("size", range(1, 9))
def test_gloo_ranks(size):
    cases = gloo_cases(size)
    payload = [(density, [make_gradients(pattern, n, size, s, torch.float64) for s in range(3)], options)
               for n, density, pattern, options in cases]
    runs = spawn(_gloo_rank, size, payload, timeout=120)
    for ci, (n, density, pattern, options) in enumerate(cases):
        results = [runs[r][ci] for r in range(size)]
        check_case(size, n, density, pattern, options, results=results, steps=3)


# --------------------------------------------------------------------------- quality

@pytest.mark.parametrize("options", [{}, {"teams": 1}, {"teams": 3}, {"teams": 2, "sag": "bruck"}])
def test_output_captures_planted_mass(options):
    """Large entries planted on every rank (shared) and on single ranks (private) must come
    through in the first call: an implementation that conserves mass by keeping everything
    in the residual, or selects the wrong entries, fails here."""
    size, n, density = 6, 12000, 0.01      # k = 120: 20 per block without SAG
    gen = torch.Generator().manual_seed(7)
    shared = torch.randperm(n, generator=gen)[:12]                   # fits B-SAG's first h = k/P too
    private = torch.randperm(n, generator=gen)[:6 * 4].view(6, 4)
    grads = []
    for r in range(size):
        g = torch.randn(n, generator=gen, dtype=torch.float64) * 0.1
        g[shared] += 10.0
        g[private[r]] += 40.0
        grads.append(g)
    results = simulate(size, lambda comm: rank_history(comm, density, [grads], options)).results
    out = results[0][0][0]
    true = sum(g.numpy() for g in grads)
    planted = torch.cat([shared, private.reshape(-1)]).numpy()
    captured = out[planted].sum() / true[planted].sum()
    assert captured > 0.99, captured
    # and the small noise does not dominate what got through
    assert np.abs(out).sum() - np.abs(out[planted]).sum() < 0.2 * np.abs(out[planted]).sum()


# --------------------------------------------------------------------------- options and state

def _construct(size, **options):
    return simulate(size, lambda comm: sc.algorithms.get("spardl")(comm, **options).sag_mode).results


def test_option_validation():
    cls = sc.algorithms.get("spardl")
    assert cls.lossless is False and "spardl" in sc.algorithms.names()
    cls(None, teams=3)                      # validation only: P unknown, checked on first use
    cls(None)
    with pytest.raises(ValueError, match="valid choices for P=6: 1, 2, 3, 6"):
        _construct(6, teams=4)
    with pytest.raises(ValueError, match="sag must be one of 'auto', 'recursive', 'bruck'"):
        cls(None, sag="ring")
    with pytest.raises(ValueError, match="power of two"):
        cls(None, teams=3, sag="recursive")
    for bad in (0, -2, 2.0, True, "2"):
        with pytest.raises(ValueError, match="teams must be"):
            cls(None, teams=bad)
    with pytest.raises(ValueError, match="does not take option"):
        cls(None, team=2)
    assert _construct(6) == ["recursive"] * 6            # the paper's default: 2 teams, R-SAG
    assert _construct(5) == ["none"] * 5
    assert _construct(2) == ["none"] * 2
    assert _construct(6, teams=3) == ["bruck"] * 6
    assert _construct(8, teams=4, sag="bruck") == ["bruck"] * 8
    assert _construct(8, teams=1, sag="bruck") == ["none"] * 8


def test_teams_checked_on_first_reduce_when_built_without_comm():
    def fn(comm):
        alg = sc.algorithms.get("spardl")(None, teams=4)
        alg.comm = comm
        alg.reduce(torch.ones(10), 1, torch.empty(10))
    with pytest.raises(ValueError, match="valid choices for P=6"):
        simulate(6, fn)


def test_bsag_state_dict_resumes_exactly():
    size, n, density, options = 6, 3000, 0.02, {"teams": 3}
    grads = [make_gradients("random", n, size, s, torch.float64) for s in range(5)]

    def straight(comm):
        return rank_history(comm, density, grads, options)

    def resumed(comm):
        first = sc.SparseAllreduce("spardl", density, comm=comm, **options)
        for g in grads[:3]:
            first(g[comm.rank].clone())
        state = first.state_dict()
        second = sc.SparseAllreduce("spardl", density, comm=comm, **options)
        second.load_state_dict(state)
        outs = [second(g[comm.rank].clone()).numpy().copy() for g in grads[3:]]
        return state["algorithm_state"], outs

    a = simulate(size, straight).results
    b = simulate(size, resumed).results
    k = ref_k(density, n)
    for r in range(size):
        st = b[r][0]["bsag"]
        assert (st["h"], st["step"]) != (k / size, 0.01 * k * 2 / size)   # Algorithm 2 ran
        assert k / size <= st["h"] <= 3 * k / size
        for j, out in enumerate(b[r][1]):
            np.testing.assert_array_equal(out, a[r][3 + j][0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_gradients_conserve(dtype):
    """Half gradients are reduced in float32 by the reducer (float32 residual) and the result is
    rounded once to the half dtype: consistent on every rank, conserving up to that rounding."""
    size, n = 6, 2001
    grads = [make_gradients("random", n, size, s, dtype) for s in range(3)]
    results = simulate(size, lambda comm: rank_history(comm, 0.02, grads, {"teams": 3})).results
    carried = [np.zeros(n) for _ in range(size)]
    eps = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    for step in range(3):
        outs = [results[r][step][0] for r in range(size)]
        for r in range(1, size):
            assert np.array_equal(outs[r], outs[0])
        res = [results[r][step][1].astype(np.float64) for r in range(size)]
        total_in = sum(grads[step][r].double().numpy() + carried[r] for r in range(size))
        exact_out = total_in - sum(res)
        np.testing.assert_allclose(outs[0], exact_out, rtol=eps, atol=1e-4)
        assert np.count_nonzero(outs[0]) > 0
        carried = res
