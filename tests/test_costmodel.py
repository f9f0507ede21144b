"""The cost model (sparsecomm/tune/costmodel.py, each algorithm's traffic()) against what the simulated Comm counts.

Every registered algorithm runs one call on the simulated Comm; its bytes sent and rounds,
rank by rank, are compared with the model's replay of the schedule: equal for the algorithms
whose sizes do not depend on the data and for the set-based ones given the ranks' real index
sets (the local top-k, computed here with a numpy reference), within a stated error for the
estimates. The papers' formulas are checked where they describe the same schedule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import algorithms, costmodel
from sparsecomm.comm import simulate

N = 6007


def _grad(rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64).float()
    x[: n // 8] *= 4.0   # a hot region shared by every rank: the unions overlap as in real gradients
    return x


def _ref_topk(v: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.arange(len(v)), -np.abs(v)))
    return np.sort(order[:k]).astype(np.int64)


def _run(name: str, P: int, density: float, options: dict, size_rounds: bool = False):
    """One reducer call on P simulated ranks: each rank's (bytes sent, rounds). The simulated
    Comm receives short (as gloo): inside a reducer call no round is spent on sizes, unless
    ``size_rounds`` takes that away from it (as NCCL)."""
    def fn(comm):
        if size_rounds:
            comm.receives_short = False
        red = sc.SparseAllreduce(name, density, comm=comm, **options)
        red(_grad(comm.rank, N))
        return red.last_stats["bytes_sent"], red.last_stats["rounds"]
    got = simulate(P, fn).results
    return np.array([g[0] for g in got]), np.array([g[1] for g in got])


def _sets(P: int, k: int) -> costmodel.IndexSets:
    return costmodel.IndexSets([_ref_topk(_grad(r, N).numpy(), k) for r in range(P)], N)


CASES = [  # (algorithm, options, P values)
    ("dense", {}, (2, 3, 4, 5)),
    ("topka", {}, (2, 3, 5, 8)),
    ("gtopk", {}, (2, 3, 4, 6)),
    ("spardl", {}, (2, 3, 4, 6, 8)),
    ("spardl", {"teams": 3, "sag": "bruck"}, (6,)),
    ("spardl", {"teams": 4}, (8,)),
    ("sparcml_recursive_double", {}, (2, 3, 4, 6)),
    ("sparcml_split_allgather", {}, (2, 3, 4, 5)),
    ("topkdsa", {}, (3, 4)),
    ("zen", {}, (2, 3, 5, 8)),
    ("zen", {"block": 1, "pull_form": "bitmap"}, (3,)),
]


@pytest.mark.parametrize("name,options,sizes", CASES, ids=[f"{c[0]}{c[1] or ''}" for c in CASES])
@pytest.mark.parametrize("density", [0.01, 0.2])
@pytest.mark.parametrize("size_rounds", [False, True], ids=["sizes-along", "size-rounds"])
def test_traffic_equals_counted(name, options, sizes, density, size_rounds):
    for P in sizes:
        sent, rounds = _run(name, P, density, options, size_rounds)
        k = sc.k_for(density, N)
        model = costmodel.traffic(name, P, N, k, sets=_sets(P, k), size_rounds=size_rounds, **options)
        assert model.exact
        assert model.sent.tolist() == sent.tolist(), (name, P, "bytes")
        assert model.rounds.tolist() == rounds.tolist(), (name, P, "rounds")


@pytest.mark.parametrize("options,sizes", [({}, (2, 3, 5)), ({"columns": 300, "rows": 3}, (4,))])
@pytest.mark.parametrize("density", [0.01, 0.2])
def test_gssgd_adapter_is_the_slowest_counted_rank(options, sizes, density):
    """gssgd's schedule comes from its own traffic(), checked rank by rank in tests/test_gssgd.py;
    here the adapter: every rank gets the slowest counted rank's (bytes, rounds)."""
    for P in sizes:
        sent, rounds = _run("gssgd", P, density, options)
        model = costmodel.traffic("gssgd", P, N, sc.k_for(density, N), **options)
        slowest = max(zip(sent.tolist(), rounds.tolist()))
        assert model.sent.tolist() == [slowest[0]] * P, (P, "bytes")
        assert model.rounds.tolist() == [slowest[1]] * P, (P, "rounds")


@pytest.mark.parametrize("name,P,tolerance", [("densestream", 4, 0.35), ("densestream", 5, 0.35),
                                              ("oktopk", 4, 0.5), ("skcompress", 4, 0.3)])
def test_estimates_within_bounds(name, P, tolerance):
    density = 0.05
    k = sc.k_for(density, N)
    sent, rounds = _run(name, P, density, {})
    options = {"first_call": True} if name == "oktopk" else {}   # its first call: repartition, radix select
    model = costmodel.traffic(name, P, N, k, sets=_sets(P, k), size_rounds=False, **options)
    assert not model.exact
    assert abs(model.bytes_per_rank - sent.max()) <= tolerance * sent.max(), (model.bytes_per_rank, sent.max())
    assert abs(model.max_rounds - rounds.max()) <= max(2, 0.2 * rounds.max()), (model.max_rounds, rounds.max())


def test_every_registered_algorithm_is_modelled():
    missing = set(algorithms.names()) - set(costmodel.modelled()) - {"auto"}
    assert not missing, f"no traffic model for {sorted(missing)}"


def test_each_class_states_its_own_traffic_model():
    """The kinds come from the classes (EXACT, SET_BASED, ESTIMATED as the module docstring lists
    them); a class with a traffic model defines traffic() itself, so a subclass (skcompress of
    topka) does not inherit its parent's schedule; one without says so, by name."""
    assert costmodel.EXACT == ("dense", "gssgd", "gtopk", "spardl", "topka")
    assert costmodel.SET_BASED == ("sparcml", "sparcml_recursive_double", "sparcml_split_allgather", "topkdsa",
                                   "zen")
    assert costmodel.ESTIMATED == ("densestream", "oktopk", "skcompress")
    for name in costmodel.modelled():
        assert "traffic" in vars(algorithms.get(name)), name
    with pytest.raises(ValueError, match="no traffic model for 'auto'"):
        costmodel.traffic("auto", 4, 1000, 10)
    with pytest.raises(NotImplementedError, match="'auto' has no traffic model"):
        algorithms.get("auto").traffic(4, 1000, 10, None, torch.float32)


@pytest.mark.parametrize("P", [2, 4, 16, 256, 1024])
def test_paper_formulas_where_they_describe_the_traffic(P):
    """SparDL Table 1 (words of 4 bytes, an entry 2 words) against the model, headers aside."""
    n, k = 1 << 20, 1 << 12
    coo = 32  # a message's header (k entries of int32 + float32 are exactly 2 words each)
    # topka: Bruck, (P-1) messages of k entries; latency log2 P
    lat, nbytes = costmodel.paper_formula("topka", P, n, k)
    m = costmodel.traffic("topka", P, n, k)
    assert m.max_rounds == lat and m.bytes_per_rank == nbytes + (P - 1) * coo
    # gtopk: 2 log2 P rounds; the critical path moves 2 log2 P messages of k entries, the table's 4 k log P words
    lat, nbytes = costmodel.paper_formula("gtopk", P, n, k)
    m = costmodel.traffic("gtopk", P, n, k)
    assert m.max_rounds == lat
    assert m.time(0.0, 1.0) == nbytes + 2 * math.log2(P) * coo
    # dense: ring reduce-scatter + all-gather, 2 (P-1)/P N words sent per rank
    lat, nbytes = costmodel.paper_formula("dense", P, n, k)
    m = costmodel.traffic("dense", P, n, k)
    assert m.bytes_per_rank == nbytes
    # SparDL without SAG (P = 2 gives one team): 2 ceil(log2 P) rounds, 4 k (P-1)/P words
    if P == 2:
        lat, nbytes = costmodel.paper_formula("spardl", P, n, k, d=1)
        m = costmodel.traffic("spardl", P, n, k)
        assert m.max_rounds == lat and m.bytes_per_rank == nbytes + 2 * coo


def test_recursive_double_between_sparcml_bounds():
    """SparCML section 4: log2(P) k <= items sent <= (P-1) k per rank."""
    P, n, k = 64, 1 << 22, 1000
    item = 8
    for overlap in (0.0, 1.0):
        sets = costmodel.IndexSets(costmodel.model_sets(P, n, k, overlap=overlap, hot_share=0.0), n)
        m = costmodel.traffic("sparcml_recursive_double", P, n, k, sets=sets)
        items = (m.bytes_per_rank - 6 * (40 + 8)) / item   # 40-byte stream headers, 8-byte size messages
        assert math.log2(P) * min(len(s) for s in sets.sets) * 0.99 <= items <= (P - 1) * k
    full = costmodel.IndexSets([np.arange(k, dtype=np.int64)] * P, n)
    m = costmodel.traffic("sparcml_recursive_double", P, n, k, sets=full)
    assert (m.bytes_per_rank - 6 * (40 + 8)) / item == math.log2(P) * k   # full overlap: the lower bound


def test_scale_cli_writes_every_row(tmp_path):
    """``python -m sparsecomm.bench scale`` at small P: a row per algorithm and P, auto's choice
    among them at its own model time, the JSON and CSV written."""
    import json

    from sparsecomm.bench.cli import main
    assert main(["scale", "--P", "2", "5", "8", "--N", "200000", "--density", "0.01", "--bandwidth", "1gbit",
                 "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "scale.json").read_text())
    assert (tmp_path / "scale.csv").exists()
    for P in (2, 5, 8):
        rows = {r["algorithm"]: r for r in report["rows"] if r["P"] == P}
        assert {"dense", "topka", "gtopk", "oktopk", "densestream", "auto@1gbit"} <= set(rows)
        auto = rows["auto@1gbit"]
        chosen = next(r for r in rows.values() if r["name"] == auto["chose"] and r["algorithm"] != "auto@1gbit")
        assert auto["time_s@1gbit"] == chosen["time_s@1gbit"] and auto["bytes_per_rank"] == chosen["bytes_per_rank"]


TWO_LEVEL_CASES = [("topka", 2, 2), ("gtopk", 2, 3), ("dense", 3, 2), ("spardl", 3, 2)]


@pytest.mark.parametrize("name, nodes, per", TWO_LEVEL_CASES)
def test_two_level_traffic_equals_counted(name, nodes, per):
    """The two-level schedule of the cost model (node reduce-scatter, the algorithm on every
    shard, node all-gather) sends, rank by rank, the bytes inside the node and between nodes
    that the simulated two-level reducer counts on its intra- and inter-node Comms, in as many
    rounds. Shards of unequal length (N odd) and their own k (5% of each, written here)."""
    n = 6007

    def fn(comm):
        red = sc.SparseAllreduce(name, 0.05, comm=comm, hierarchy="node", nodes=sc.Topology(nodes, per))
        red(_grad(comm.rank, n))
        s = red.last_stats
        return s["intra_bytes_sent"], s["inter_bytes_sent"], s["intra_rounds"] + s["inter_rounds"]

    got = np.array(simulate(nodes * per, fn).results)
    bounds = [q * n // per for q in range(per + 1)]
    shard_k = [max(1, -(-(bounds[q + 1] - bounds[q]) * 5 // 100)) for q in range(per)]
    links = costmodel.Links(50e-6, 8e-9, 5e-6, 2e-11)
    pred = costmodel.predict(name, n, 0, nodes, per, links, hierarchy="node", shard_k=shard_k)
    inside, outside = pred.traffic.sent_by_level(per)
    assert inside.tolist() == got[:, 0].tolist()
    assert outside.tolist() == got[:, 1].tolist()
    assert pred.traffic.rounds.tolist() == got[:, 2].tolist()


def test_time_on_nodes_shares_the_nic():
    """Inside a node each rank pays its own intra link; the messages leaving a node share its
    NIC (bytes add up, latency once per rank's messages); the round costs the longer side.
    With one rank per node it is the flat time."""
    a, b, ia, ib = 1e-4, 1e-8, 1e-6, 1e-10
    links = costmodel.Links(a, b, ia, ib)
    t = costmodel.Traffic(4)   # nodes {0, 1} and {2, 3}
    t.round([0, 1, 0], [2, 3, 1], [1000, 3000, 500])
    t.round([2, 3], [3, 2], [10_000, 10])
    first = max(a + 4000 * b, ia + 500 * ib)     # node 0's NIC carries both outgoing messages
    second = ia + 10_000 * ib
    assert t.time_on_nodes(2, links) == pytest.approx(first + second, rel=1e-12)
    assert t.time_on_nodes(1, links) == pytest.approx(t.time(a, b), rel=1e-12)


def test_scale_cli_clusters(tmp_path):
    """``scale --ranks-per-node``: a flat and a two-level row per algorithm and node count, and
    auto's row is the (hierarchy, algorithm) of least predicted time plus compute."""
    import json

    from sparsecomm.algorithms.auto import compute_ns
    from sparsecomm.bench.cli import main
    assert main(["scale", "--ranks-per-node", "2", "--nodes", "2", "3", "--N", "100000", "--density", "0.01",
                 "--bandwidth", "1gbit", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "cluster.json").read_text())["rows"]
    for nodes in (2, 3):
        here = [r for r in rows if r["nodes"] == nodes]
        auto = next(r for r in here if r["algorithm"] == "auto@1gbit")
        plain = {(r["hierarchy"], r["algorithm"]): r for r in here if r is not auto}
        assert {h for h, _ in plain} == {"flat", "node"} and len(plain) == 2 * 11
        total = {key: r["time_s@1gbit"] + compute_ns(key[1], 0.01) * 1e-9 * (100000 if key[0] == "flat" else 50000)
                 for key, r in plain.items() if key[1] in ("dense", "topka", "spardl", "gtopk", "oktopk",
                                                            "sparcml_recursive_double", "sparcml_split_allgather",
                                                            "topkdsa", "densestream", "zen")}
        best = min(total, key=total.get)
        assert auto["chose"] == f"{best[1]} ({best[0]})" and auto["time_s@1gbit"] == plain[best]["time_s@1gbit"]
