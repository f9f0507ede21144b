"""``python -m sparsecomm.bench scale``: every algorithm's message traffic from P = 2 to 1024.

Traffic only (no gradient is reduced): :mod:`sparsecomm.costmodel` replays each algorithm's
messages with sizes only -- exact for the data-independent algorithms, exact given the index
sets for the SparCML family, estimates for densestream, oktopk and skcompress (the model is
checked against the simulated Comm's counts at small P in tests/test_costmodel.py). The ranks'
index sets come from :func:`sparsecomm.costmodel.model_sets` (a model of real gradients' local
top-k: shared fraction, hot layers; drawn at length ``--model-n`` and scaled to N), so P = 1024
needs about P k / scale int64 values, well under 1 GiB.

Time per call = the alpha-beta cost of the message schedule (the ``time(alpha, beta)`` of what
:func:`sparsecomm.costmodel.traffic` returns, a :class:`~sparsecomm.traffic.Traffic`) with alpha given
(fitted by ``python -m sparsecomm.bench collectives`` on the emulated links) and beta = 8 /
bandwidth. ``auto`` is the algorithm :mod:`sparsecomm.tune.auto` picks for that (P, N,
k, alpha, beta) with its compute table; its time is that algorithm's. Writes ``scale.json``,
``scale.csv`` and ``scale_<bandwidth>.png`` per bandwidth into ``--out``.

With ``--ranks-per-node L`` the study is of clusters instead (:func:`run_cluster`): ``--nodes``
nodes of L ranks, every algorithm of :data:`CLUSTER_ROWS` flat (its schedule on all n L ranks,
each message on the link it takes: a node's ranks share its NIC at ``--bandwidth``, inside a
node each rank has its own ``--intra-bandwidth`` link) and two-level (the reducer's
``hierarchy="node"``), timed by :func:`sparsecomm.costmodel.predict`; ``auto`` is the
(hierarchy, algorithm) :func:`sparsecomm.tune.choose_layout` picks. Writes
``cluster.json``, ``cluster.csv`` and ``cluster_<bandwidth>.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from ..tune import costmodel
from ..tune import choose_algorithm, choose_layout
from ..comm.collectives import block_bounds
from ..reduce import k_for
from .plots import line_plot, pyplot

__all__ = ["main", "ROWS", "run", "CLUSTER_ROWS", "run_cluster"]

#: (label, algorithm, options) of the study's rows
ROWS: list[tuple[str, str, dict]] = [
    ("dense", "dense", {}),
    ("topka", "topka", {}),
    ("spardl (R-SAG, 2 teams)", "spardl", {}),
    ("spardl (B-SAG, 2 teams)", "spardl", {"teams": 2, "sag": "bruck"}),
    ("gtopk", "gtopk", {}),
    ("gssgd", "gssgd", {}),
    ("sparcml_recursive_double", "sparcml_recursive_double", {}),
    ("sparcml_split_allgather", "sparcml_split_allgather", {}),
    ("topkdsa", "topkdsa", {}),
    ("oktopk", "oktopk", {}),
    ("densestream", "densestream", {}),
    ("skcompress", "skcompress", {}),
    ("zen", "zen", {}),
]

DEFAULT_P = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512, 768, 1024]


def _paper(name: str, options: dict, P: int, N: int, k: int):
    if name == "spardl":
        d = 2 if P >= 4 and P % 2 == 0 else 1
        if options.get("sag") == "bruck":
            return None   # Table 1 gives a range for B-SAG
        return costmodel.paper_formula("spardl", P, N, k, d=d)
    if name == "gssgd":
        return costmodel.paper_formula("gssgd", P, N, k)
    return costmodel.paper_formula(name, P, N, k)


def run(sizes: list[int], N: int, densities: list[float], bandwidths: dict[str, float], alpha: float,
        model_n: int, say=print) -> dict:
    rows = []
    for d in densities:
        k = k_for(d, N)
        for P in sizes:
            start = time.perf_counter()
            sets = costmodel.default_sets(P, N, k, model_n=model_n)
            observed = None
            per_bw = {}
            for label, name, options in ROWS:
                if P < 4 and options.get("sag") == "bruck":
                    continue
                if name == "spardl" and options.get("sag") == "bruck" and P % 2:
                    continue
                sched = costmodel.traffic(name, P, N, k, sets=sets, **options)
                lat_bytes = _paper(name, options, P, N, k)
                row = {"algorithm": label, "name": name, "P": P, "N": N, "density": d, "k": k,
                       "bytes_per_rank": sched.bytes_per_rank, "rounds": sched.max_rounds, "exact": sched.exact,
                       "paper_latency_terms": None if lat_bytes is None else lat_bytes[0],
                       "paper_bytes": None if lat_bytes is None else lat_bytes[1]}
                for bw, beta in bandwidths.items():
                    row[f"time_s@{bw}"] = sched.time(alpha, beta)
                    per_bw.setdefault(bw, {})[label] = row[f"time_s@{bw}"]
                rows.append(row)
            for bw, beta in bandwidths.items():   # the auto row: what auto picks, at its time
                pick = choose_algorithm(P, N, k, alpha, beta, sets=sets, observed_k=observed)
                label = next(lbl for lbl, nm, op in ROWS if nm == pick["algorithm"] and not op)
                src = next(r for r in rows if r["algorithm"] == label and r["P"] == P and r["density"] == d)
                rows.append({**src, "algorithm": f"auto@{bw}", "name": "auto", "chose": pick["algorithm"],
                             "paper_latency_terms": None, "paper_bytes": None})
            say(f"density {d:g} P = {P:5d}: {time.perf_counter() - start:.1f} s", flush=True)
    return {"N": N, "densities": densities, "sizes": sizes, "alpha_s": alpha,
            "bandwidths": {bw: 8 / beta for bw, beta in bandwidths.items()}, "model_n": model_n, "rows": rows}


#: the algorithms of the cluster study (their default options)
CLUSTER_ROWS = ["dense", "topka", "spardl", "gtopk", "gssgd", "oktopk", "sparcml_recursive_double",
                "sparcml_split_allgather", "topkdsa", "densestream", "zen"]


def run_cluster(nodes: list[int], per: int, N: int, densities: list[float], bandwidths: dict[str, float],
                alpha: float, intra_alpha: float, intra_beta: float, model_n: int, say=print) -> dict:
    """Every :data:`CLUSTER_ROWS` algorithm flat and two-level on ``n`` x ``per`` ranks for each
    n of ``nodes``, at each inter-node bandwidth; the model's (hierarchy, algorithm) choice."""
    rows = []
    for d in densities:
        k = k_for(d, N)
        bounds = block_bounds(N, per)
        shard_k = [k_for(d, bounds[q + 1] - bounds[q]) for q in range(per)]
        for n in nodes:
            start = time.perf_counter()
            P = n * per
            sets = costmodel.default_sets(P, N, k, model_n=model_n)
            found, records = {}, {}
            for name in CLUSTER_ROWS:
                for hierarchy in costmodel.LAYOUTS:
                    links = {bw: costmodel.Links(alpha, beta, intra_alpha, intra_beta)
                             for bw, beta in bandwidths.items()}
                    first = next(iter(links.values()))
                    pred = costmodel.predict(name, N, k, n, per, first, hierarchy=hierarchy, shard_k=shard_k,
                                             sets=sets)
                    row = {"algorithm": name, "hierarchy": hierarchy, "nodes": n, "ranks_per_node": per, "P": P,
                           "N": N, "density": d, "k": k, "intra_bytes": pred.intra_bytes,
                           "inter_bytes": pred.inter_bytes, "nic_bytes": pred.nic_bytes, "rounds": pred.rounds,
                           "exact": pred.exact}
                    for bw, link in links.items():
                        row[f"time_s@{bw}"] = pred.traffic.time_on_nodes(per, link)
                    found[(hierarchy, name)] = row
                    records[(hierarchy, name)] = pred.traffic
                    rows.append(row)
            for bw, beta in bandwidths.items():
                pick = choose_layout(n, per, N, k, shard_k, costmodel.Links(alpha, beta, intra_alpha, intra_beta),
                                     records=records)
                src = found[(pick["hierarchy"], pick["algorithm"])]
                rows.append({**src, "algorithm": f"auto@{bw}", "hierarchy": "auto",
                             "chose": f"{pick['algorithm']} ({pick['hierarchy']})"})
            say(f"density {d:g} {n:4d} nodes x {per}: {time.perf_counter() - start:.1f} s", flush=True)
    return {"N": N, "densities": densities, "nodes": nodes, "ranks_per_node": per, "alpha_s": alpha,
            "intra_alpha_s": intra_alpha, "intra_bytes_per_s": 1 / intra_beta,
            "bandwidths": {bw: 8 / beta for bw, beta in bandwidths.items()}, "model_n": model_n, "rows": rows}


def _cluster_plot(report: dict, bw: str, density: float, path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    series = {}
    for r in report["rows"]:
        if r["density"] != density or (r["algorithm"].startswith("auto@") and r["algorithm"] != f"auto@{bw}"):
            continue
        label = "auto" if r["algorithm"].startswith("auto@") else f"{r['algorithm']} ({r['hierarchy']})"
        series.setdefault(label, []).append((r["nodes"], r[f"time_s@{bw}"]))
    return line_plot(plt, path, series, f"nodes of {report['ranks_per_node']} ranks (log)",
                     f"alpha-beta model: N = {report['N']}, density {density}, {bw} between nodes, "
                     f"{report['intra_bytes_per_s'] / 1e9:g} GB/s inside", log_x=True)


def _cluster_main(args, bws: dict[str, float]) -> int:
    intra_beta = 1.0 / args.intra_bandwidth
    report = run_cluster(sorted(set(args.nodes)), args.ranks_per_node, args.N, args.density, bws, args.alpha,
                         args.intra_alpha, intra_beta, args.model_n)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster.json").write_text(json.dumps(report, indent=1))
    cols = ["algorithm", "hierarchy", "nodes", "ranks_per_node", "P", "N", "density", "k", "intra_bytes",
            "inter_bytes", "nic_bytes", "rounds", "exact"] + [f"time_s@{bw}" for bw in bws] + ["chose"]
    with open(out / "cluster.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in report["rows"]:
            w.writerow(r)
    for bw in bws:
        for d in args.density:
            p = _cluster_plot(report, bw, d, out / f"cluster_{bw}_{d:g}.png")
            if p:
                print(f"wrote {p}")
    for d in args.density:
        for bw in bws:
            print(f"\nms per call at {bw} between nodes, density {d}, N = {args.N}, "
                  f"{args.ranks_per_node} ranks per node")
            print(f"{'algorithm':<26}{'hierarchy':>10}" + "".join(f"{n:>9}" for n in report["nodes"]))
            seen = dict.fromkeys((r["algorithm"], r["hierarchy"]) for r in report["rows"] if r["density"] == d
                                 and (not r["algorithm"].startswith("auto@") or r["algorithm"] == f"auto@{bw}"))
            for name, hierarchy in seen:
                t = {r["nodes"]: r for r in report["rows"] if r["algorithm"] == name and r["hierarchy"] == hierarchy
                     and r["density"] == d}
                line = f"{name:<26}{hierarchy:>10}" + "".join(f"{t[n][f'time_s@{bw}'] * 1e3:>9.1f}"
                                                              for n in report["nodes"])
                if name.startswith("auto@"):
                    line += "   " + ", ".join(f"{n}: {t[n]['chose']}" for n in report["nodes"])
                print(line)
    print(f"wrote {out / 'cluster.json'}, {out / 'cluster.csv'}")
    return 0


def crossovers(report: dict, bw: str, density: float) -> dict:
    """Where gssgd passes gtopk, and spardl's advantage over topka by P."""
    rows = [r for r in report["rows"] if r["density"] == density]
    t = {}
    for r in rows:
        t.setdefault(r["algorithm"], {})[r["P"]] = r.get(f"time_s@{bw}")
    out = {}
    out["gssgd faster than gtopk at P"] = [P for P in report["sizes"] if t["gssgd"][P] < t["gtopk"][P]]
    out["topka / spardl by P"] = {P: t["topka"][P] / t["spardl (R-SAG, 2 teams)"][P] for P in report["sizes"]}
    return out


def _plot(report: dict, bw: str, density: float, path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    series = {}
    for r in report["rows"]:
        if r["density"] != density or (r["name"] == "auto" and r["algorithm"] != f"auto@{bw}"):
            continue
        series.setdefault(r["algorithm"].split("@")[0], []).append((r["P"], r[f"time_s@{bw}"]))
    return line_plot(plt, path, series, "P (ranks, log)", f"alpha-beta model: N = {report['N']}, density {density}, "
                      f"{bw}, alpha = {report['alpha_s'] * 1e6:.0f} us", log_x=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench scale",
                                 description="Bytes, rounds and alpha-beta time of every algorithm, P = 2 .. 1024.")
    ap.add_argument("--P", type=int, nargs="+", default=DEFAULT_P)
    ap.add_argument("--N", type=int, default=15_000_000)
    ap.add_argument("--density", type=float, nargs="+", default=[0.01])
    ap.add_argument("--alpha", type=float, default=124e-6,
                    help="latency (s); default: fitted on the emulated 1 Gbit/s links (docs/scale.md)")
    ap.add_argument("--bandwidth", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--model-n", type=int, default=1 << 20, help="length the index sets are drawn at")
    ap.add_argument("--ranks-per-node", type=int, default=None,
                    help="study clusters of --nodes nodes of this many ranks, flat and two-level (instead of --P)")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--intra-bandwidth", type=float, default=100e9,
                    help="bytes/s of each rank's link inside a node (default 100e9: NVLink class)")
    ap.add_argument("--intra-alpha", type=float, default=5e-6, help="latency (s) inside a node")
    ap.add_argument("--out", default="bench_results/scale")
    args = ap.parse_args(argv)
    if args.ranks_per_node is not None and (args.ranks_per_node < 1 or any(n < 1 for n in args.nodes)
                                            or args.intra_bandwidth <= 0 or args.intra_alpha < 0):
        ap.error("--ranks-per-node >= 1, --nodes >= 1, --intra-bandwidth > 0 and --intra-alpha >= 0")
    if any(p < 1 for p in args.P) or args.N < 1 or not all(0 < d <= 1 for d in args.density):
        ap.error("--P >= 1, --N >= 1 and --density in (0, 1]")
    bws = {}
    for bw in args.bandwidth:
        low = bw.lower()
        if not low.endswith("gbit") and not low.endswith("mbit"):
            ap.error(f"--bandwidth like 1gbit or 100mbit, got {bw!r}")
        rate = float(low[:-4]) * (1e9 if low.endswith("gbit") else 1e6)
        bws[bw] = 8 / rate
    if args.ranks_per_node is not None:
        return _cluster_main(args, bws)
    report = run(sorted(set(args.P)), args.N, args.density, bws, args.alpha, args.model_n)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report["crossovers"] = {f"{bw}@{d}": crossovers(report, bw, d) for bw in bws for d in args.density}
    (out / "scale.json").write_text(json.dumps(report, indent=1))
    cols = ["algorithm", "P", "N", "density", "k", "bytes_per_rank", "rounds", "exact", "paper_latency_terms",
            "paper_bytes"] + [f"time_s@{bw}" for bw in bws] + ["chose"]
    with open(out / "scale.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in report["rows"]:
            w.writerow(r)
    for bw in bws:
        p = _plot(report, bw, args.density[0], out / f"scale_{bw}.png")
        if p:
            print(f"wrote {p}")
    d0 = args.density[0]
    show = [P for P in (2, 4, 8, 16, 64, 256, 1024) if P in report["sizes"]]
    for bw in bws:
        print(f"\nms per call at {bw}, density {d0}, N = {args.N}, alpha = {args.alpha * 1e6:.0f} us")
        print(f"{'algorithm':<28}" + "".join(f"{P:>9}" for P in show))
        for label in dict.fromkeys(r["algorithm"] for r in report["rows"]):
            if label.startswith("auto@") and label != f"auto@{bw}":
                continue
            t = {r["P"]: r[f"time_s@{bw}"] for r in report["rows"] if r["algorithm"] == label and r["density"] == d0}
            print(f"{label:<28}" + "".join(f"{t[P] * 1e3:>9.1f}" if P in t else f"{'-':>9}" for P in show))
    print(json.dumps(report["crossovers"], indent=1, default=str)[:3000])
    print(f"wrote {out / 'scale.json'}, {out / 'scale.csv'}")
    return 0
