"""Tables and the plot of docs/convergence.md from the study's JSON (``python -m sparsecomm.bench
accuracy`` reports, one per run): updates and time to target per method over seeds, the metric
at equal updates, and the ratio of each method's updates to dense's in the same run.

    python scripts/convergence_summary.py docs/results/convergence/accuracy_digits_cnn_P4_1gbit_d0.01_seed*.json
    python scripts/convergence_summary.py --plot docs/img/convergence_digits_cnn.png \\
        --panel "density 1%" 'docs/results/convergence/*_1gbit_d0.01_seed*.json' \\
        --panel "density 0.1%" 'docs/results/convergence/*_1gbit_d0.001_seed*.json'

A method that misses the target in a run counts as "not reached" there: its mean is then given
as a lower bound (the budget) and its ratio to dense as such.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path


def load(paths: list[str], fraction: float | None = None) -> list[dict]:
    """The reports; with ``fraction``, each run's target set again to that fraction of dense's
    best accuracy in the run, and every method's updates and time to it taken from its curve."""
    reports = [json.loads(Path(p).read_text()) for p in sorted(paths)]
    if not reports:
        raise SystemExit(f"no reports in {paths}")
    for r in reports if fraction is not None else ():
        if r.get("metric", "accuracy") != "accuracy":
            raise SystemExit("--fraction is for accuracy tasks")
        dense = next(m for m in r["methods"] if m["method"] == "dense")
        r["target"] = fraction * dense["best_accuracy"]
        r["target_how"] = f"{100 * fraction:g}% of dense's best accuracy in this run (recomputed from the curves)"
        for m in r["methods"]:
            hit = next((p for p in m["curve"] if p["accuracy"] >= r["target"]), None)
            m["time_to_target_s"], m["updates_to_target"] = (hit["time_s"], hit["updates"]) if hit else (None, None)
    return reports


def _stat(values: list[float], fmt: str = "{:.0f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def point_at(curve: list[dict], updates: int, metric: str) -> float:
    """The metric at the last evaluation at or before ``updates``."""
    return [p[metric] for p in curve if p["updates"] <= updates][-1]


def table(reports: list[dict], at: list[int], bound: float) -> str:
    """Markdown: one row per method (the order of the first report)."""
    metric = reports[0].get("metric", "accuracy")
    show = (lambda v: f"{100 * v:.1f}") if metric == "accuracy" else (lambda v: f"{v:.0f}")
    unit = "%" if metric == "accuracy" else ""
    head = (f"| method | updates to target (per seed) | mean ± sd | ratio to dense (mean; max) | within "
            f"{100 * bound:.0f}% | time to target (s) | " + " | ".join(f"{metric} at {u} ({unit or 'ppl'})"
                                                                        for u in at)
            + " | MB / rank / update (median; mean) |")
    lines = [head, "|" + "---|" * (7 + len(at))]
    names = list(dict.fromkeys(m["method"] for r in reports for m in r["methods"]))
    for name in names:   # a method only some runs trained: over those runs
        runs = [r for r in reports if any(m["method"] == name for m in r["methods"])]
        rows = [next(m for m in r["methods"] if m["method"] == name) for r in runs]
        dense = [next(m for m in r["methods"] if m["method"] == "dense") for r in runs]
        ups = [m["updates_to_target"] for m in rows]
        seeds = " / ".join(str(u) if u is not None else f">{m['updates']}" for u, m in zip(ups, rows))
        reached = [u for u in ups if u is not None]
        if len(reached) == len(ups):
            mean = _stat([float(u) for u in ups])
            ratios = [u / d["updates_to_target"] for u, d in zip(ups, dense)]
            ratio = f"{statistics.mean(ratios):.2f}; {max(ratios):.2f}"
            ok = "yes" if statistics.mean(ratios) <= 1 + bound + 1e-9 else "no"
            times = _stat([m["time_to_target_s"] for m in rows], "{:.1f}")
        else:
            mean = f"> {statistics.mean([u if u is not None else m['updates'] for u, m in zip(ups, rows)]):.0f}"
            ratio = f"> {statistics.mean([(u if u is not None else m['updates']) / d['updates_to_target'] for u, m, d in zip(ups, rows, dense)]):.2f}"  # noqa: E501
            ok = f"no ({len(ups) - len(reached)} of {len(ups)} not reached)"
            times = "-"
        values = [_stat([float(show(point_at(m["curve"], u, metric))) for m in rows], "{:.1f}") for u in at]
        mb = statistics.mean(m["bytes"] for m in rows) / 1e6
        mean_mb = statistics.mean(m["bytes_total"] / m["updates"] for m in rows) / 1e6   # a warm-up's denser steps
        lines.append(f"| {name} | {seeds} | {mean} | {ratio} | {ok} | {times} | " + " | ".join(values)
                     + f" | {mb:.4f}; {mean_mb:.4f} |")
    return "\n".join(lines)


def plot(panels: list[tuple[str, list[dict]]], path: str, skip: tuple[str, ...] = ()) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 5.2 * rows), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (title, reports) in zip(axes.flat, panels):
        metric = reports[0].get("metric", "accuracy")
        scale = 100 if metric == "accuracy" else 1
        names = [m["method"] for m in reports[0]["methods"]
                 if m["method"].split("+")[0] not in skip and all(any(n["method"] == m["method"] for n in r["methods"])
                                                                  for r in reports)]
        bases = list(dict.fromkeys(n.split("+")[0] for n in names))
        for name in names:
            curves = [next(m for m in r["methods"] if m["method"] == name)["curve"] for r in reports]
            xs = [p["updates"] for p in curves[0]]
            ys = [scale * statistics.mean(c[i][metric] for c in curves) for i in range(len(xs))]
            base, _, modifier = name.partition("+")
            ax.plot(xs, ys, color=colors[bases.index(base) % 10], label=name,
                    linestyle={"": "-", "mc": "--", "mcm": ":"}.get(modifier, "-."),
                    linewidth=2.2 if base == "dense" else 1.3)
        target = statistics.mean(r["target"] for r in reports)
        ax.axhline(scale * target, color="black", linestyle=":", linewidth=1, label="target (mean)")
        ax.set_ylim(80 if metric == "accuracy" else None, 100 if metric == "accuracy" else None)
        ax.set_xlabel("updates")
        ax.set_ylabel("test accuracy (%), mean over seeds" if metric == "accuracy" else metric)
        r0 = reports[0]
        ax.set_title(f"{r0['task']}, P = {r0['P']}, {title} ({len(reports)} seeds)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="*", help="JSON reports of one configuration (one per seed)")
    ap.add_argument("--at", type=int, nargs="+", default=[50, 100, 200], help="updates to give the metric at")
    ap.add_argument("--fraction", type=float, default=None,
                    help="set each run's target again: this fraction of dense's best accuracy (default: the run's)")
    ap.add_argument("--bound", type=float, default=0.10, help="'within' means a mean ratio to dense <= 1 + this")
    ap.add_argument("--plot", default=None, help="write the plot of the --panel configurations here")
    ap.add_argument("--panel", nargs=2, action="append", default=[], metavar=("TITLE", "GLOB"))
    ap.add_argument("--skip", nargs="*", default=[], help="algorithms to leave out of the plot (with their +mc ...)")
    args = ap.parse_args(argv)
    if args.reports:
        reports = load(args.reports, args.fraction)
        accuracy = reports[0].get("metric", "accuracy") == "accuracy"
        targets = ", ".join(f"{100 * r['target']:.2f}%" if accuracy else f"{r['target']:.1f}" for r in reports)
        print(f"target: {reports[0]['target_how'].split(' in this run')[0]} in each run; targets {targets}")
        print(table(reports, [u for u in args.at if u <= reports[0]["steps"]], args.bound))
    if args.plot:
        plot([(title, load(glob.glob(pattern))) for title, pattern in args.panel], args.plot, tuple(args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
