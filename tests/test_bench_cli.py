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


def _run(args, tmp_path, timeout=120, extra_env=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")}
    env.update(extra_env or {})
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


def test_collectives_on_a_tasks_real_gradients(tmp_path):
    """--gradients digits: N is the digits MLP's parameter count, and every rank's timed gradient
    is a real one: the first layer's weights of pixels that are zero in every digits image get
    exactly zero gradient, which a standard normal vector never has, and the norm is far below
    a standard normal vector's sqrt(N)."""
    load_digits = pytest.importorskip("sklearn.datasets").load_digits
    out = tmp_path / "out"
    proc = _run(["collectives", "--gradients", "digits", "--gradients-warmup", "1", "--algorithms", "topka", "zen",
                 "--density", "0.01", "--repeats", "1", "--nproc", "2", "--out", str(out), "--check-n", "2003",
                 "--pingpong-max", str(1 << 12)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hidden, p = 256, 2
    n = 64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10   # MLP 64-256-256-10
    report = json.loads((out / "collectives.json").read_text())
    assert report["N"] == n and report["gradients"]["N"] == n and report["gradients"]["source"] == "digits"
    assert "MLP 64-256-256-10" in report["gradients"]["model"] and "MLP 64-256-256-10" in proc.stdout
    k = math.ceil(0.01 * n)
    by = {r["algorithm"]: r for r in report["rows"]}
    assert all(r["N"] == n and r["k"] == k for r in report["rows"])
    # topka all-gathers one COO message of k entries of an N-element vector
    assert by["topka"]["bytes_sent"] == (p - 1) * coo_message_bytes(k, n, 4)
    dead_pixels = int((load_digits().data == 0).all(axis=0).sum())   # 3 of the 64
    assert dead_pixels > 0
    per_rank = report["gradients"]["per_rank"]
    assert [r["rank"] for r in per_rank] == [0, 1]
    for r in per_rank:
        assert all(z >= dead_pixels * hidden for z in r["zeros"]), r
        assert all(0 < norm < 0.05 * math.sqrt(n) for norm in r["norm"]), r
    assert per_rank[0]["norm"] != per_rank[1]["norm"]   # each rank its own shard


def test_collectives_gradients_options_are_checked(capsys, tmp_path):
    from sparsecomm.bench import collectives   # argparse refuses before any rank starts
    for args, says in ((["--gradients", "digits", "--N", "1000"], "--N is the model's parameter count"),
                       (["--gradients", "digits", "--width", "1"], "--width must be > 0 and is for vgg16"),
                       (["--gradients", "nosuchtask"], "unknown --gradients 'nosuchtask'"),
                       (["--width", "1"], "with random gradients use --N")):
        with pytest.raises(SystemExit) as exit_:
            collectives.main(["--algorithms", "topka", "--out", str(tmp_path), *args])
        assert exit_.value.code == 2 and says in capsys.readouterr().err, args


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


def test_hierarchy_both_times_flat_and_two_level_and_counts_the_node_link(tmp_path):
    """2 nodes x 2 ranks on loopback: each algorithm has a flat and a two-level row; the bytes
    per node between nodes and inside the node follow the schedules, up to the per-call
    agreement messages (under 1 KB)."""
    out = tmp_path / "out"
    n, p, per = 20000, 4, 2
    proc = _run(["collectives", "--algorithms", "dense", "topka", "--N", str(n), "--density", "0.01", "--repeats", "1",
                 "--nproc", str(p), "--nproc-per-node", str(per), "--hierarchy", "both", "--out", str(out),
                 "--check-n", "2003", "--pingpong-max", str(1 << 12)], tmp_path,
                # the link counter counts messages: the node's steps as messages, not shared memory
                extra_env={"SPARSECOMM_NODE_SHM": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vs flat" in proc.stdout
    report = json.loads((out / "collectives_2x2.json").read_text())
    assert (report["nodes"], report["ranks_per_node"], report["hierarchies"]) == (2, 2, ["flat", "node"])
    by = {(r["algorithm"], r["hierarchy"]): r for r in report["rows"]}
    assert list(by) == [("dense", "flat"), ("dense", "node"), ("topka", "flat"), ("topka", "node")]
    shard, k, k_shard = n // per, 200, 100
    coo, coo_shard = coo_message_bytes(k, n, 4), coo_message_bytes(k_shard, shard, 4)
    expected = {   # (between nodes, inside the node) per node
        # ring 0 -> 1 -> 2 -> 3 -> 0 of 2 (P - 1) chunks of 4 N / P bytes: one crossing and one
        # intra-node edge per node
        ("dense", "flat"): (2 * (p - 1) * 4 * n // p, 2 * (p - 1) * 4 * n // p),
        # the node's reduce-scatter and all-gather (each rank sends the other's half twice), then
        # a ring between the two nodes on each shard (2 (n - 1) chunks of half the shard)
        ("dense", "node"): (per * 2 * 4 * shard // 2, per * 2 * 4 * shard // 2 * 2),
        # Bruck all-gather, rank r sends to r - 1, then two messages to r - 2: node 0 = {0, 1}
        # sends 0 -> 3 (one message), 0 -> 2 and 1 -> 3 (two each) out, 1 -> 0 (one) inside
        ("topka", "flat"): (5 * coo, coo),
        # each shard owner sends its shard's COO message to the other node; the node's dense
        # reduce-scatter and all-gather inside
        ("topka", "node"): (per * coo_shard, per * 2 * 4 * shard // 2 * 2),
    }
    for key, (between, inside) in expected.items():
        row = by[key]
        assert 0 <= row["node_inter_bytes"] - between < 1024, (key, row["node_inter_bytes"], between)
        assert 0 <= row["node_intra_bytes"] - inside < 1024, (key, row["node_intra_bytes"], inside)
        assert row["node_link_tx_bytes"] is None           # loopback: no interface per node
    for algo in ("dense", "topka"):
        assert by[(algo, "node")]["speedup_vs_flat"] == pytest.approx(
            by[(algo, "flat")]["time_s"] / by[(algo, "node")]["time_s"], rel=1e-12)
        assert by[(algo, "flat")]["speedup_vs_flat"] is None
    assert set(report["checks"]) == {"dense/flat", "dense/node", "topka/flat", "topka/node"}


def test_hierarchy_node_under_a_launcher_without_local_world_size_says_what_is_missing(tmp_path):
    proc = _run(["collectives", "--algorithms", "topka", "--N", "1000", "--hierarchy", "node"], tmp_path, timeout=60,
                extra_env={"RANK": "0", "WORLD_SIZE": "4"})
    assert proc.returncode == 2
    assert "LOCAL_WORLD_SIZE" in proc.stderr and "--nnodes" in proc.stderr


def test_accuracy_hierarchy_both_trains_flat_and_two_level_from_the_same_start(tmp_path):
    """dense flat and two-level, 2 nodes x 2 ranks: the target from flat dense; two-level dense
    sends each rank's half of every bucket over a ring of two nodes."""
    pytest.importorskip("sklearn")
    out = tmp_path / "out"
    proc = _run(["accuracy", "--task", "digits", "--nproc", "4", "--nproc-per-node", "2", "--hierarchy", "both",
                 "--algorithms", "dense", "--steps", "2", "--eval-every", "2", "--out", str(out), "--quiet"],
                tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "accuracy_digits_2x2.json").read_text())
    assert [m["label"] for m in report["methods"]] == ["dense", "dense (two-level)"]
    flat, two = report["methods"]
    assert report["target"] == pytest.approx(0.99 * flat["best_accuracy"])
    assert flat["inter_bytes"] is None and (report["nodes"], report["ranks_per_node"]) == (2, 2)
    # per bucket: 2 (n - 1) chunks of half the rank's shard (a quarter of the bucket), float32
    assert two["inter_bytes"] == pytest.approx(4 * report["params"] / 2, rel=0.02)
    # the same start: both runs' first evaluation is the same model's
    assert flat["curve"][0]["accuracy"] == two["curve"][0]["accuracy"]
    assert "| dense (two-level) |" in proc.stdout
