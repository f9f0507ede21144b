"""The collective benchmark CLI (`python -m sparsecomm.bench collectives`): loopback ranks, no launcher."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

from _reference import coo_message_bytes

ALGOS = ["dense", "topka", "spardl"]


def _run(args, tmp_path, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "sparsecomm.bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)


def test_collectives_cli_writes_csv_and_json(tmp_path):
    out = tmp_path / "out"
    proc = _run(["collectives", "--algorithms", *ALGOS, "--N", "20000", "--density", "0.01", "--repeats", "2",
                 "--nproc", "2", "--out", str(out), "--check-n", "20011", "--pingpong-max", str(1 << 20)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "correctness checked" in proc.stdout
    with open(out / "collectives.csv") as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == sorted(ALGOS)
    report = json.loads((out / "collectives.json").read_text())
    assert [r["algorithm"] for r in report["rows"]] == ALGOS
    assert report["P"] == 2 and report["N"] == 20000
    assert report["alpha_s"] >= 0 and report["beta_s_per_byte"] > 0
    by = {r["algorithm"]: r for r in report["rows"]}
    n, p, k = 20000, 2, 200   # k = ceil(0.01 * 20000)
    # dense: the backend's ring allreduce, 2 (P - 1) rounds of ceil(4 N / P) bytes (float32)
    assert (by["dense"]["bytes_sent"], by["dense"]["rounds"]) == (2 * (p - 1) * math.ceil(4 * n / p), 2 * (p - 1))
    # topka: one Bruck all-gather of a COO message of k float32 entries, ceil(log2 P) rounds
    assert (by["topka"]["bytes_sent"], by["topka"]["rounds"]) == ((p - 1) * coo_message_bytes(k, n, 4),
                                                                  math.ceil(math.log2(p)))
    for r in report["rows"]:
        assert r["time_s"] > 0 and r["rounds"] >= 1 and r["bytes_sent"] > 0 and r["k"] == k
        # the speedup is dense's median time over this row's, from the times in the same report
        assert r["speedup_vs_dense"] == pytest.approx(by["dense"]["time_s"] / r["time_s"], rel=1e-12)
        assert float(rows[r["algorithm"]]["speedup_vs_dense"]) == pytest.approx(r["speedup_vs_dense"], rel=1e-12)
        assert r["bound_s"] == pytest.approx(r["rounds"] * report["alpha_s"] + r["bytes_sent"] * report["beta_s_per_byte"],
                                             rel=1e-12)
        assert r["bound_over_measured"] is None or r["bound_over_measured"] == pytest.approx(r["bound_s"] / r["comm_s"],
                                                                                             rel=1e-12)
    assert report["checks"]["topka"]["lossless"] and not report["checks"]["spardl"]["lossless"]


def test_collectives_cli_shuffled_order_and_auto_after_its_trials(tmp_path):
    """--shuffle is recorded; auto's row is timed after its trial calls, on the algorithm it kept
    (named in the row, one of its candidates, the same bytes and rounds as that algorithm's row
    at topka's fixed message size)."""
    from sparsecomm.algorithms.auto import CANDIDATES
    out = tmp_path / "out"
    proc = _run(["collectives", "--algorithms", "topka", "auto", "--N", "20000", "--density", "0.01", "--repeats", "3",
                 "--nproc", "2", "--out", str(out), "--check-n", "20011", "--pingpong-max", str(1 << 20), "--shuffle"],
                tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shuffled per repeat order" in proc.stdout and "auto at density 0.01 chose" in proc.stdout
    report = json.loads((out / "collectives.json").read_text())
    assert report["order"] == "shuffled per repeat"
    by = {r["algorithm"]: r for r in report["rows"]}
    assert by["auto"]["chose"] in CANDIDATES
    if by["auto"]["chose"] == "topka":
        assert (by["auto"]["bytes_sent"], by["auto"]["rounds"]) == (by["topka"]["bytes_sent"], by["topka"]["rounds"])


def test_collectives_cli_rejects_unknown_algorithm(tmp_path):
    proc = _run(["collectives", "--algorithms", "dense", "nosuchalgo", "--N", "1000"], tmp_path, timeout=60)
    assert proc.returncode != 0
    assert "unknown algorithm(s) 'nosuchalgo'" in proc.stderr and "topka" in proc.stderr


def test_unknown_command(tmp_path):
    proc = _run(["frobnicate"], tmp_path, timeout=60)
    assert proc.returncode == 2 and "collectives" in proc.stderr


def test_baselines_join_and_runs_at_two_p_make_a_time_vs_p_plot(tmp_path):
    out = tmp_path / "out"
    names = ["dense", "topka", "torch_fp16", "torch_powersgd"]
    for nproc in (2, 3):
        proc = _run(["collectives", "--algorithms", *names, "--N", "30000", "--density", "0.01", "--repeats", "1",
                     "--nproc", str(nproc), "--out", str(out), "--check-n", "20011",
                     "--pingpong-max", str(1 << 16)], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {p: json.loads((out / f"collectives_P{p}.json").read_text()) for p in (2, 3)}
    for p, run in runs.items():
        by = {r["algorithm"]: r for r in run["rows"]}
        assert sorted(by) == sorted(names) and run["P"] == p
        assert by["torch_fp16"]["baseline"] and not by["topka"]["baseline"]
        # fp16 is one ring allreduce of 2 bytes per element, half of dense's 4
        assert by["torch_fp16"]["bytes_sent"] * 2 == pytest.approx(by["dense"]["bytes_sent"], rel=1e-3)
        assert by["torch_powersgd"]["bytes_sent"] < by["torch_fp16"]["bytes_sent"]
        assert run["checks"]["torch_powersgd"]["baseline"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed: the plots are not written")
    assert (out / "time_vs_P.png").stat().st_size > 0
