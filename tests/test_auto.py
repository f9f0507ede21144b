"""algorithm="auto": the same choice on every rank, the cheapest by the model, measured among
the shortlist (trial calls), in last_stats and the handshake, kept through state_dict (also
mid-way through the trials), and bad options refused."""

from __future__ import annotations

import math
import time

import pytest
import torch

import sparsecomm as sc
from sparsecomm.algorithms.auto import choose_algorithm, shortlist
from sparsecomm.comm import simulate
from sparsecomm.errors import AgreedValueError


def _grad(rank: int, n: int, step: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


def _log_interp(points, density):
    xs = [math.log(0.001), math.log(0.01), math.log(0.05)]
    x = min(max(math.log(density), xs[0]), xs[2])
    j = 0 if x <= xs[1] else 1
    return points[j] + (points[j + 1] - points[j]) * (x - xs[j]) / (xs[j + 1] - xs[j])


def _ref_cheapest(P: int, n: int, k: int, alpha: float, beta: float) -> tuple[str, float]:
    """The reference of "cheapest by the model", written here: each candidate's time is its
    schedule's alpha-beta time (the cost model's traffic, an input) plus the per-element
    compute of the documented table, interpolated linearly in log density between 0.1%, 1%
    and 5% and held outside; the least time wins, ties to the earlier candidate."""
    from sparsecomm import costmodel
    from sparsecomm.algorithms.auto import CANDIDATES, COMPUTE_NS
    sets = costmodel.default_sets(P, n, k, model_n=1 << 16)
    times = []
    for i, name in enumerate(CANDIDATES):
        try:
            # the simulated Comm sends sizes along inside a reducer call (no size rounds)
            wire = costmodel.traffic(name, P, n, k, sets=sets, size_rounds=False)
        except ValueError:
            continue
        ns = _log_interp(COMPUTE_NS[name], k / n)
        times.append((wire.time(alpha, beta) + ns * 1e-9 * n, i, name))
    t, _, name = min(times)
    return name, t


@pytest.mark.parametrize("P,n,density,alpha,beta,expect", [
    (4, 20_000, 1.0, 1e-4, 8e-9, "dense"),          # nothing sparse to gain: dense
    (4, 2_000_000, 0.001, 1e-4, 8e-9, None),          # sparse wins at 1 Gbit/s
    (2, 300, 0.5, 1e-3, 1e-12, None),                 # latency-bound tiny bucket
])
def test_choice_is_the_cheapest_and_identical_everywhere(P, n, density, alpha, beta, expect):
    def fn(comm):   # the plain candidates (the codec variants: test_codec_variants_*)
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=alpha, beta=beta, codecs=False)
        out = red(_grad(comm.rank, n))
        return red.last_stats, out
    results = simulate(P, fn).results
    stats = [r[0] for r in results]
    choices = {s["auto_choice"] for s in stats}
    assert len(choices) == 1
    choice = choices.pop()
    k = sc.k_for(density, n)
    want, want_s = _ref_cheapest(P, n, k, alpha, beta)
    assert choice == want   # the first call runs the model's cheapest (it heads the shortlist)
    if expect:
        assert choice == expect
    else:
        assert choice != "dense"
    for s in stats:
        assert s["auto_predicted_s"] == pytest.approx(want_s)
        assert s["auto_measured_s"] == s["total_s"] > 0
        assert (s["auto_alpha"], s["auto_beta"]) == (alpha, beta)
    for r in results[1:]:
        assert torch.equal(r[1], results[0][1])
    # the result is the chosen algorithm's, bit for bit
    def direct(comm):
        return sc.SparseAllreduce(choice, density, comm=comm)(_grad(comm.rank, n))
    assert torch.equal(simulate(P, direct).results[0], results[0][1])


def test_pingpong_fit_is_rank_zeros_on_every_rank():
    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm)
        red(_grad(comm.rank, 50_000))
        return red.last_stats
    stats = simulate(3, fn, alpha=0.0, beta=0.0).results
    assert len({(s["auto_alpha"], s["auto_beta"], s["auto_choice"]) for s in stats}) == 1
    assert stats[0]["auto_beta"] >= 0 and stats[0]["handshake_rounds"] > 0


def test_handshake_names_a_different_choice(monkeypatch):
    """Options that differ fail the first handshake (before any decision); should the decision
    itself still differ (here: rank 1's model is made to see only gtopk), the second handshake
    names both choices."""
    import threading

    from sparsecomm.algorithms import auto
    real = auto.choose_algorithm

    def skewed(*args, **kwargs):
        if threading.current_thread().name == "sim-rank-1":
            kwargs["candidates"] = ("gtopk",)
        return real(*args, **kwargs)
    monkeypatch.setattr(auto, "choose_algorithm", skewed)

    def fn(comm):
        sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, tune=0)(_grad(comm.rank, 30_000))
    with pytest.raises(AgreedValueError, match="auto/topka.*auto/gtopk"):
        simulate(2, fn)

    def differing_options(comm):
        opts = dict(candidates=("gtopk",)) if comm.rank == 1 else {}
        sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, tune=0, **opts)(_grad(comm.rank, 30_000))
    with pytest.raises(AgreedValueError, match=r"options: ranks \[0\] have .*candidates=None.*ranks \[1\] have "
                                               r".*candidates=\('gtopk',\)"):
        simulate(2, differing_options)


def test_state_dict_keeps_the_choice():
    n, density = 40_000, 0.01

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=1e-4, beta=8e-9,
                                 candidates=("gtopk", "topka"), tune=0)
        red(_grad(comm.rank, n, 0))
        state = red.state_dict()
        # a resumed reducer told other costs keeps the saved choice and continues identically
        resumed = sc.SparseAllreduce("auto", density, comm=comm, alpha=1.0, beta=1e-3,
                                     candidates=("gtopk", "topka"), tune=0)
        resumed.load_state_dict(state)
        a = red(_grad(comm.rank, n, 1)).clone()
        b = resumed(_grad(comm.rank, n, 1))
        return state["algorithm_state"]["choice"], resumed.last_stats["auto_choice"], torch.equal(a, b), \
            torch.equal(red.residual, resumed.residual)
    for first, second, same_out, same_res in simulate(2, fn).results:
        assert first == second and same_out and same_res


@pytest.mark.parametrize("options,match", [
    ({"alpha": -1.0, "beta": 1e-9}, "alpha"), ({"alpha": float("nan"), "beta": 1e-9}, "alpha"),
    ({"alpha": 1e-4}, "both"), ({"candidates": "topka"}, "candidates"), ({"candidates": ("auto",)}, "candidates"),
    ({"candidates": ("nosuch",)}, "candidates"), ({"compute": {"topka": -1}}, "compute"),
    ({"tune": -1}, "tune"), ({"tune": True}, "tune"), ({"tune": 1.5}, "tune"), ({"shortlist": 0}, "shortlist"),
    ({"margin": 0.5}, "margin"), ({"margin": float("inf")}, "margin"),
    ({"candidates": ("gtopk+delta_binary",)}, "codec variants"), ({"candidates": ("topka+zip",)}, "after '\\+'"),
    ({"candidates": ("topka+skcompress+skcompress",)}, "at most one of each"), ({"codecs": 1}, "codecs"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        sc.algorithms.get("auto")(None, **options)


@pytest.mark.distributed
def test_resume_through_the_ddp_hook_keeps_the_choice():
    """tests/test_resume.py's matrix for auto (its ping-pong fit measured, not given): a run
    resumed from checkpoints after steps 1, 2 and 3 continues bit-identically, so every bucket
    made the same choice as in the uninterrupted run."""
    from test_resume import _run_matrix
    diffs, regrouped = _run_matrix(2, ["bucket_cap_mb=0.01"], only=["auto"])
    assert regrouped > 0
    assert all(d == 0.0 for d in diffs.values()), diffs


# -- measured choice among the shortlist ---------------------------------------------------

CANDS = ("topka", "spardl", "gtopk")


def _slowed(monkeypatch, delays: dict[str, float], rank: int = 1) -> None:
    """Make candidates measurably slower on one rank only (a sleep after their real work): the
    slowest rank's time is what a call costs, so every rank must see them as slow."""
    for name, delay in delays.items():
        cls = sc.algorithms.get(name)
        real = cls.reduce

        def slow(self, *args, _real=real, _delay=delay, **kwargs):
            _real(self, *args, **kwargs)
            if self.comm.rank == rank:
                time.sleep(_delay)
        monkeypatch.setattr(cls, "reduce", slow)


def _reference(P: int, n: int, density: float, sequence: list[str], steps: int):
    """Each call run by the named algorithm directly (Algorithm.reduce on g + e, the residual
    left in acc), the residual carried from whichever algorithm ran before."""
    def fn(comm):
        k = sc.k_for(density, n)
        algs = {name: sc.algorithms.get(name)(comm) for name in set(sequence)}
        e = torch.zeros(n)
        outs = []
        for step in range(steps):
            acc = e + _grad(comm.rank, n, step)
            out = torch.empty(n)
            algs[sequence[step]].reduce(acc, k, out)
            e = acc
            outs.append((out, e.clone()))
        return outs
    return simulate(P, fn).results


def test_tuning_measures_the_shortlist_and_keeps_the_fastest(monkeypatch):
    P, n, density, tune = 3, 20_000, 0.01, 2
    k = sc.k_for(density, n)
    model = choose_algorithm(P, n, k, 1e-4, 8e-9, candidates=CANDS)
    short = shortlist(model["predictions"], CANDS, 3, 100.0)
    assert short[0] == model["algorithm"] and sorted(short) == sorted(CANDS)
    # the model's two favourites are slow on rank 1 only: the third must be kept everywhere
    _slowed(monkeypatch, {short[0]: 0.2, short[1]: 0.1})
    steps = tune * 3 + 2

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS,
                                 margin=100.0, tune=tune)
        rows = []
        for step in range(steps):
            out = red(_grad(comm.rank, n, step)).clone()
            rows.append((dict(red.last_stats), out, red.residual.clone()))
        return rows
    results = simulate(P, fn).results
    ran = [row[0]["auto_choice"] for row in results[0]]
    assert ran == [short[0]] * tune + [short[1]] * tune + [short[2]] * tune + [short[2]] * 2
    assert [row[0]["auto_tuning"] for row in results[0]] == [True] * 3 * tune + [False] * 2
    for rank_rows in results:
        assert [row[0]["auto_choice"] for row in rank_rows] == ran
        trials = rank_rows[-1][0]["auto_trials"]
        assert trials == results[0][-1][0]["auto_trials"]          # the same table on every rank
        assert trials[short[0]] >= 0.2 and trials[short[1]] >= 0.1 and trials[short[2]] < 0.1
        assert rank_rows[0][0]["auto_trials"] is None
        assert rank_rows[2][0]["auto_predicted_s"] == pytest.approx(model["predictions"][short[1]])
    # every call's result and residual are those of the algorithm it ran, bit for bit
    ref = _reference(P, n, density, ran, steps)
    for rank in range(P):
        for step in range(steps):
            assert torch.equal(results[rank][step][1], ref[rank][step][0]), (rank, step, ran[step])
            assert torch.equal(results[rank][step][2], ref[rank][step][1]), (rank, step, ran[step])


def test_tuning_keeps_each_ranks_best_trial_then_the_slowest_rank(monkeypatch):
    """The documented rule: each rank's *best* time per candidate (of its ``tune`` calls: the
    first also pays first-call costs), then a candidate's time is its *slowest rank's*, the
    least wins. The trial calls' clock (``auto._clock``) is a per-rank virtual clock here, moved
    on by fixed seconds after a candidate's real work (the work itself takes milliseconds):

        call 1 / call 2 (s)   short[0]      short[1]   short[2]
        rank 0                3 / 4         0 / 0      0 / 0
        rank 1                100 / 0       10 / 10    20 / 20
        rank 2                0 / 0         0 / 0      0 / 0

    best per rank, slowest rank: 3, 10, 20 -> short[0] is kept (its worst call, 100 s, is the
    slowest of all; its fastest rank's best is 0)."""
    import threading

    from sparsecomm.algorithms import auto as auto_mod

    P, n, density, tune = 3, 20_000, 0.01, 2
    k = sc.k_for(density, n)
    model = choose_algorithm(P, n, k, 1e-4, 8e-9, candidates=CANDS)
    short = shortlist(model["predictions"], CANDS, 3, 100.0)
    extra = {short[0]: {0: [3.0, 4.0], 1: [100.0, 0.0]}, short[1]: {1: [10.0, 10.0]},
             short[2]: {1: [20.0, 20.0]}}
    local = threading.local()   # simulate runs each rank in its own thread

    monkeypatch.setattr(auto_mod, "_clock", lambda: time.perf_counter() + getattr(local, "skew", 0.0))
    for name, per_rank in extra.items():
        cls = sc.algorithms.get(name)

        def timed(self, *args, _real=cls.reduce, _per_rank=per_rank, **kwargs):
            _real(self, *args, **kwargs)
            call = self.__dict__.setdefault("_test_calls", 0)
            self._test_calls = call + 1
            delays = _per_rank.get(self.comm.rank, [0.0, 0.0])
            local.skew = getattr(local, "skew", 0.0) + (delays[call] if call < len(delays) else 0.0)
        monkeypatch.setattr(cls, "reduce", timed)

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS,
                                 margin=100.0, tune=tune)
        for step in range(tune * 3 + 1):
            red(_grad(comm.rank, n, step))
        return dict(red.last_stats)
    for stats in simulate(P, fn).results:
        assert not stats["auto_tuning"] and stats["auto_choice"] == short[0], stats["auto_choice"]
        trials = stats["auto_trials"]
        assert 3.0 <= trials[short[0]] < 6.0, trials   # + real work: margin for a loaded machine
        assert 10.0 <= trials[short[1]] < 13.0, trials
        assert 20.0 <= trials[short[2]] < 23.0, trials


def test_tuning_resumes_mid_way(monkeypatch):
    P, n, density = 2, 20_000, 0.01
    k = sc.k_for(density, n)
    short = shortlist(choose_algorithm(P, n, k, 1e-4, 8e-9, candidates=CANDS)["predictions"], CANDS, 3, 100.0)
    _slowed(monkeypatch, {short[0]: 0.2, short[2]: 0.1})
    opts = dict(alpha=1e-4, beta=8e-9, candidates=CANDS, margin=100.0)

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, **opts)
        for step in range(3):                  # mid-way through the second candidate's trials
            red(_grad(comm.rank, n, step))
        state = red.state_dict()
        assert state["algorithm_state"]["tuning"]["calls"] == 3
        # a fresh reducer (other alpha/beta: it must not decide anew) continues the trials
        resumed = sc.SparseAllreduce("auto", density, comm=comm, **{**opts, "alpha": 1.0, "beta": 1e-3})
        resumed.load_state_dict(state)
        same = []
        for step in range(3, 8):
            a = red(_grad(comm.rank, n, step)).clone()
            b = resumed(_grad(comm.rank, n, step))
            same.append((red.last_stats["auto_choice"], resumed.last_stats["auto_choice"], torch.equal(a, b),
                         torch.equal(red.residual, resumed.residual)))
        return same, resumed.last_stats["auto_trials"]
    for same, trials in simulate(P, fn).results:
        assert [s[0] for s in same] == [short[1], short[2], short[2], short[1], short[1]]
        assert all(s[0] == s[1] and s[2] and s[3] for s in same), same
        assert set(trials) == set(short) and min(trials, key=trials.get) == short[1]


def test_tuning_handshake_names_the_shortlist(monkeypatch):
    """Should the shortlists differ (here rank 1's is cut to two), the handshake names both."""
    import threading

    from sparsecomm.algorithms import auto
    real = auto.shortlist

    def skewed(*args, **kwargs):
        short = real(*args, **kwargs)
        return short[:2] if threading.current_thread().name == "sim-rank-1" else short
    monkeypatch.setattr(auto, "shortlist", skewed)

    def fn(comm):
        sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS,
                           margin=100.0)(_grad(comm.rank, 30_000))
    with pytest.raises(AgreedValueError, match=r"auto/tune\(\w+\+\w+\+\w+\)x2.*auto/tune\(\w+\+\w+\)x2"):
        simulate(3, fn)


@pytest.mark.parametrize("mangle,match", [
    (lambda t: t.update(calls=99), "tuning record"),
    (lambda t: t.update(shortlist=["topka"]), "tuning record"),
    (lambda t: t.update(shortlist=["topka", "nosuch"]), "tuning record"),
    (lambda t: t.update(shortlist=["topka", "topkdsa"]), "tuning record"),     # not among candidates=
    (lambda t: t["times"].update(topka=[float("nan")]), "tuning record"),
    (lambda t: t.update(tune=5), "tune=2"),
    (lambda t: t.update(calls=True), "tuning record"),
    (lambda t: t.update(calls=3), "tuning record"),          # 3 calls made, but 1 time recorded
    (lambda t: t.update(times={}), "tuning record"),
    (lambda t: t.update(settling="no"), "tuning record"),
])
def test_malformed_tuning_state_is_refused(mangle, match):
    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS, margin=100.0)
        red(_grad(comm.rank, 20_000))
        state = red.state_dict()
        mangle(state["algorithm_state"]["tuning"])
        fresh = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS, margin=100.0)
        with pytest.raises(ValueError, match=match):
            fresh.load_state_dict(state)
    simulate(2, fn)


def test_a_choice_outside_the_candidates_is_refused():
    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS, tune=0)
        red(_grad(comm.rank, 20_000))
        state = red.state_dict()
        state["algorithm_state"]["choice"] = "nope"
        with pytest.raises(ValueError, match="choice 'nope' is not among this reducer's candidates"):
            sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS,
                               tune=0).load_state_dict(state)
    simulate(2, fn)


@pytest.mark.parametrize("case", ["alpha on rank 0 only", "rank 0 resumed, rank 1 fresh"])
def test_ranks_that_would_prepare_differently_raise_everywhere(case):
    """auto's first decision may measure a ping-pong: a rank given alpha/beta, or resumed from a
    saved decision, would skip it while its peers send. The reducer's first handshake (before
    prepare) compares what prepare depends on, so every rank raises the same ValueError instead
    of exchanging mismatched messages (on gloo that aborted the process)."""
    n = 20_000

    def fn(comm):
        if case == "alpha on rank 0 only":
            opts = dict(alpha=1e-4, beta=8e-9) if comm.rank == 0 else {}
            sc.SparseAllreduce("auto", 0.01, comm=comm, **opts)(_grad(comm.rank, n))
        else:
            red = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, tune=0)
            red(_grad(comm.rank, n))
            state = red.state_dict()
            fresh = sc.SparseAllreduce("auto", 0.01, comm=comm)
            if comm.rank == 0:
                fresh.load_state_dict({**state, "residual": None})
            fresh(_grad(comm.rank, n))
    pattern = "options" if case == "alpha on rank 0 only" else r"auto/resumed\(20000,200,[\w+]+\)"
    with pytest.raises(AgreedValueError, match=pattern):
        simulate(2, fn)


def test_density_schedule_trials_start_once_k_holds_still(monkeypatch):
    """While a warm-up schedule changes k every call, trials at different k would not compare:
    each call at a new k runs the model's pick untimed; the trials begin once k holds, and the
    candidates' instances (their adaptive state) carry over the changes of k."""
    P, n = 2, 20_000
    schedule = sc.DensitySchedule.per_step([0.2, 0.1, 0.05], every=1)   # then the reducer's density
    short = shortlist(choose_algorithm(P, n, sc.k_for(0.01, n), 1e-4, 8e-9, candidates=CANDS)["predictions"],
                      CANDS, 3, 100.0)

    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, candidates=CANDS, margin=100.0,
                                 density_schedule=schedule)
        rows = []
        for step in range(12):
            red(_grad(comm.rank, n, step))
            rows.append((red.last_stats["k"] if "k" in red.last_stats else None,
                         red.last_stats["auto_choice"], red.last_stats["auto_tuning"]))
        return rows, red.last_stats["auto_trials"], red.algorithm.trial_times
    (rows, trials, times), (rows1, trials1, _) = simulate(P, fn).results
    assert rows == rows1 and trials == trials1
    # steps 0-2: a new k each call (the model's pick at that k, untimed); step 3: the first call at
    # the final k (untimed); steps 4-9: 2 trials of each shortlisted candidate; then the choice
    assert all(tuning for _, _, tuning in rows[:10]) and not any(tuning for _, _, tuning in rows[10:])
    assert [choice for _, choice, _ in rows[4:10]] == [short[0]] * 2 + [short[1]] * 2 + [short[2]] * 2
    assert rows[3][1] == short[0]
    assert {name: len(t) for name, t in times.items()} == {name: 2 for name in short}
    assert set(trials) == set(short)


def test_stats_of_a_call_that_ran_no_candidate():
    """A non-finite gradient under nonfinite="propagate" goes the dense path: no candidate ran,
    and last_stats must not repeat the previous call's choice."""
    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm, alpha=1e-4, beta=8e-9, tune=0, nonfinite="propagate")
        red(_grad(comm.rank, 20_000))
        first = red.last_stats["auto_choice"]
        g = _grad(comm.rank, 20_000, 1)
        g[5] = float("nan")
        red(g)
        return first, red.last_stats["auto_choice"], red.last_stats["auto_tuning"]
    for first, second, tuning in simulate(2, fn).results:
        assert first is not None and second is None and tuning is False


def _bad_state_on_one_rank(rank, world_size):
    """Rank 1 restores a hook checkpoint whose auto state is malformed; rank 0 a good one."""
    import time as _time

    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def run(state, steps):
        model = DDP(net)
        model.register_comm_hook(state, sc.ddp_hook)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            model(torch.randn(8, 16, generator=gen)).square().sum().backward()
        state._drain()

    state = sc.DDPHookState("auto", 0.05, alpha=1e-4, beta=8e-9, tune=0)
    run(state, 3)
    saved = state.local_state_dict()
    if rank == 1:
        for j in saved["algorithm_states"]:
            saved["algorithm_states"][j] = {"choice": "topka"}   # keys missing
    resumed = sc.DDPHookState("auto", 0.05, alpha=1e-4, beta=8e-9, tune=0)
    resumed.load_state_dict(saved)
    t0 = _time.monotonic()
    try:
        run(resumed, 2)
        return {"type": None}
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"type": type(exc).__name__, "msg": str(exc), "s": _time.monotonic() - t0}


@pytest.mark.distributed
def test_a_bad_saved_state_on_one_rank_fails_every_rank_quickly():
    from sparsecomm.testing import spawn
    results = spawn(_bad_state_on_one_rank, 2, timeout=120)
    assert results[1]["type"] == "ValueError" and "auto: a state_dict holds" in results[1]["msg"], results[1]
    assert results[0]["type"] == "CommAbortedError" and "rank 1 failed: ValueError" in results[0]["msg"], results[0]
    assert results[0]["s"] < 30, results[0]   # the Comm timeout is 300 s; DDP construction is in the window


def test_nonfinite_policy_follows_the_candidate_of_the_new_k():
    """When a schedule's step changes k, the reducer prepares auto for that k before its
    non-finite check: here the warm-up density picks dense (which skips the check) and the next
    k topka; a NaN on that step must take the "propagate" path, not reach topka's selection."""
    n = 20_000
    schedule = sc.DensitySchedule.per_step([0.9], every=1)

    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.001, comm=comm, alpha=1e-4, beta=8e-9, tune=0,
                                 candidates=("dense", "topka"), density_schedule=schedule)
        rows = []
        for step in range(3):
            g = _grad(comm.rank, n, step)
            if step == 1 and comm.rank == 0:
                g[7] = float("nan")
            out = red(g)
            rows.append((red.last_stats["auto_choice"], red.last_stats["nonfinite_ranks"],
                         bool(torch.isnan(out).any()), bool(torch.isnan(red.residual).any())))
        return rows
    for rows in simulate(2, fn).results:
        assert rows[0] == ("dense", [], False, False)
        assert rows[1] == (None, [0], True, False)       # propagated: dense sum of the raw gradients
        assert rows[2] == ("topka", [], False, False)


@pytest.mark.parametrize("save_after", [0, 1, 2, 4])
def test_checkpoints_under_a_density_schedule_resume_identically(monkeypatch, save_after):
    """Saved at any step of a warm-up schedule (k changing, then trials, then the choice), a
    fresh reducer continues as the one that saved: the same candidate every call, bit-identical
    results and residuals (the trial times are made decisive by delays on rank 1)."""
    n = 20_000
    schedule = sc.DensitySchedule.per_step([0.05, 0.02], every=1)
    _slowed(monkeypatch, {"topka": 0.2, "gtopk": 0.1})
    opts = dict(alpha=1e-4, beta=8e-9, candidates=CANDS, margin=100.0, density_schedule=schedule)

    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm, **opts)
        for step in range(save_after + 1):
            red(_grad(comm.rank, n, step))
        resumed = sc.SparseAllreduce("auto", 0.01, comm=comm, **opts)
        resumed.load_state_dict(red.state_dict())
        rows = []
        for step in range(save_after + 1, 12):
            a = red(_grad(comm.rank, n, step)).clone()
            b = resumed(_grad(comm.rank, n, step))
            rows.append((red.last_stats["auto_choice"], resumed.last_stats["auto_choice"],
                         red.last_stats["auto_tuning"], resumed.last_stats["auto_tuning"],
                         torch.equal(a, b), torch.equal(red.residual, resumed.residual)))
        return rows, red.last_stats["auto_choice"]
    for rows, final in simulate(2, fn).results:
        assert all(r[0] == r[1] and r[2] == r[3] and r[4] and r[5] for r in rows), rows
        assert final == "spardl" and not rows[-1][2]


# -- codec variants -------------------------------------------------------------------------------
def _topka_times(P, n, k, alpha, beta):
    """topka and its codec variants per call, by hand from the documented tables: TopkA's Bruck
    all-gather of P plain COO messages of m bytes (distance d: min(d, P - d) messages' bytes in one
    message per rank, one round) plus COMPUTE_NS["topka"] x N; a variant's messages are
    ceil(plain bytes x the codec's ratio) + 8 (each message's size travels just before it: the
    simulated Comm inside a reducer call), its compute adds encoding the k selected entries and
    decoding the (P - 1) m / 8 entries received (int32 index + float32 value), and per round a
    message's fixed cost to encode and decode, all times the documented share of a core."""
    from _reference import coo_message_bytes
    from sparsecomm.algorithms.auto import CODEC_COST, CODEC_SHARE, COMPUTE_NS

    density = k / n
    m = coo_message_bytes(k, n, 4)
    steps, d = [], 1
    while d < P:
        steps.append(min(d, P - d) * m)
        d *= 2
    base_compute = _log_interp(COMPUTE_NS["topka"], density) * 1e-9 * n
    times = {"topka": sum(alpha + b * beta for b in steps) + base_compute}
    for codecs, (ratio, encode, decode, (encode_us, decode_us)) in CODEC_COST.items():
        wire = sum(alpha + (math.ceil(b * _log_interp(ratio, density)) + 8) * beta for b in steps)
        codec = CODEC_SHARE * (1e-9 * (_log_interp(encode, density) * k + _log_interp(decode, density) * (P - 1) * m / 8)
                               + 1e-6 * (encode_us + decode_us) * len(steps))
        times[f"topka+{codecs}"] = wire + base_compute + codec
    return times


@pytest.mark.parametrize("beta,paying", [(8e-8, True), (8e-11, False)], ids=["100mbit", "100gbit"])
def test_codec_variants_are_candidates_where_the_model_says_they_pay(beta, paying):
    """On a slow link the model's prediction of every topka codec variant (by hand above) is in
    the predictions, below plain topka, and the cheapest is chosen; on a fast link none pays and
    none is a candidate (only plain topka is predicted)."""
    P, n, density, alpha = 4, 2_000_000, 0.01, 1e-4

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=alpha, beta=beta, tune=0,
                                 candidates=("topka", "topka+delta_binary", "topka+skcompress",
                                             "topka+delta_binary+skcompress"))
        red(_grad(comm.rank, n))
        return red.last_stats, red.algorithm.decision["predictions"]
    results = simulate(P, fn).results
    k = sc.k_for(density, n)
    want = _topka_times(P, n, k, alpha, beta)
    for stats, predictions in results:
        if paying:
            paid = {name: t for name, t in want.items() if t < want["topka"]}
            assert len(paid) == 3, want   # all three variants pay at 100 Mbit/s
            cheapest = min(paid, key=paid.get)
            assert stats["auto_choice"] == cheapest
            assert stats["auto_predicted_s"] == pytest.approx(want[cheapest], rel=1e-3)
        else:
            assert stats["auto_choice"] == "topka"
            assert set(predictions) == {"topka"}, predictions


def test_a_chosen_codec_variant_runs_that_variant_bit_for_bit():
    """auto's codec variant is the algorithm with those codec options: its result and residual
    equal a reducer built with them, rank by rank, over two calls."""
    P, n, density = 4, 50_000, 0.01
    grads = [[_grad(r, n, s) for r in range(P)] for s in range(2)]

    def run(name, **options):
        def fn(comm):
            red = sc.SparseAllreduce(name, density, comm=comm, **options)
            outs = [red(grads[s][comm.rank].clone()) for s in range(2)]
            return outs, red.residual.clone(), red.last_stats.get("auto_choice")
        return simulate(P, fn).results
    chosen = run("auto", alpha=1e-4, beta=8e-7, candidates=("topka+delta_binary+skcompress",), tune=0)
    direct = run("topka", index_codec="delta_binary", value_codec="skcompress")
    for (outs, residual, choice), (want_outs, want_residual, _) in zip(chosen, direct):
        assert choice == "topka+delta_binary+skcompress"
        assert all(torch.equal(a, b) for a, b in zip(outs, want_outs))
        assert torch.equal(residual, want_residual)
