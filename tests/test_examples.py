"""The README's demo runs end to end (small settings) and prints its comparison table."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# | method | time to target (s) | speedup vs dense | updates to target | final accuracy | per-update (ms) | MB |
_ROW = re.compile(r"^(?:\[rank 0\] )?\| ([\w ()@+]+?) \| ([\d.]+|not reached) \| ([\d.]+x|-) \| (>?\d+) \| "
                  r"([\d.]+)% \| (\d+) \| ([\d.]+) \|$", re.MULTILINE)


# the rows each --algorithms list gives: under the default recipe (dgc+mc) every sparsecomm
# algorithm with momentum correction and DGC's warm-up, dense and PyTorch's hooks as named
@pytest.mark.parametrize("algorithms,recipe,labels", [
    (["dense", "topka", "spardl"], [], ["dense", "topka@dgc+mc", "spardl@dgc+mc"]),
    (["dense", "gtopk", "torch_fp16", "torch_powersgd"], ["--recipe", "plain"],
     ["dense", "gtopk", "torch_fp16", "torch_powersgd"]),
    (["dense", "zen", "topka@gs"], ["--recipe", "mc"], ["dense", "zen+mc", "topka@gs"]),
])
def test_ddp_demo_prints_a_row_per_algorithm_and_writes_json_and_plot(algorithms, recipe, labels, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--nproc", "2",
                           "--steps", "8", "--hidden", "64", "--bandwidth", "none", *recipe,
                           "--algorithms", *algorithms, "--out", str(tmp_path), "--no-progress"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {m.group(1).split(" ")[0]: m for m in _ROW.finditer(proc.stdout)}
    assert sorted(rows) == sorted(labels), proc.stdout
    for name in labels[1:]:
        if "@" not in name:  # a warm-up sends up to 25% in its first updates: the median may be dense's
            assert float(rows["dense"].group(7)) > float(rows[name].group(7)), f"{name} should send fewer bytes"
    assert "REAL data: scikit-learn's digits" in proc.stdout
    assert re.search(r"communication = [\d.]+x compute", proc.stdout), proc.stdout
    result = json.loads((tmp_path / "demo.json").read_text())
    assert [m["method"] for m in result["methods"]] == labels
    assert result["task"] == "digits" and result["compute_s"] > 0 and result["P"] == 2
    by = {m["method"]: m for m in result["methods"]}
    # dense reaches 99% of its own best accuracy by definition of the target
    assert by["dense"]["time_to_target_s"] is not None
    assert result["target"] == pytest.approx(0.99 * by["dense"]["best_accuracy"])
    # the MLP 64-64-64-10 has 9,034 parameters; at P = 2 a ring allreduce of B bytes sends
    # 2 (P - 1) ceil(B / P) = B bytes per rank, whatever buckets DDP cut the gradient into
    params, world = 64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10, 2
    assert by["dense"]["bytes"] == 2 * (world - 1) * math.ceil(4 * params / world)
    if "torch_fp16" in by:
        assert by["torch_fp16"]["bytes"] == 2 * (world - 1) * math.ceil(2 * params / world)
    for name, row in rows.items():
        m = by[name]
        assert len(m["curve"]) == 8 // 4 + 1 and m["curve"][0]["updates"] == 0 and m["curve"][-1]["updates"] == 8
        assert row.group(7) == f"{m['bytes'] / 1e6:.3f}", (name, row.group(0))
        assert row.group(5) == f"{100 * m['final_accuracy']:.1f}", (name, row.group(0))
        if m["time_to_target_s"] is None:
            assert row.group(2) == "not reached" and row.group(3) == "-"
        else:  # the printed speedup is dense's time to target over this row's
            assert row.group(3) == f"{by['dense']['time_to_target_s'] / m['time_to_target_s']:.2f}x", row.group(0)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "demo.png").stat().st_size > 0


def test_ddp_demo_rejects_unknown_algorithm():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--algorithms", "nope"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "unknown algorithm 'nope'" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None,
                    reason="emulating links needs root and iproute2 (ip, tc)")
def test_ddp_demo_runs_on_the_emulated_network(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--nproc", "2",
                           "--steps", "5", "--hidden", "64", "--algorithms", "dense", "topka",
                           "--out", str(tmp_path), "--no-progress"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "emulated 1gbit network" in proc.stdout
    # the link line names the configured rate and the rate the launcher measured at start
    assert re.search(r"1gbit links \([\d.]+ [GM]bit/s measured rank 0 -> rank 1, interface eth0\)", proc.stdout), \
        proc.stdout
    assert re.search(r"^\[rank 0\] \| topka@dgc\+mc \| ([\d.]+|not reached) \| ", proc.stdout, re.MULTILINE), proc.stdout
    # Which advice follows depends on this machine's compute speed; it must match the measured ratio.
    ratio = json.loads((tmp_path / "demo.json").read_text())["comm_over_compute"]
    assert re.search(r"communication = [\d.]+x compute", proc.stdout), proc.stdout
    assert _load_demo()._ratio_advice(ratio, "1gbit") in proc.stdout


@functools.lru_cache(maxsize=None)
def _load_demo():
    """examples/ddp_demo.py as a module (it is a script, not part of the package), loaded once."""
    spec = importlib.util.spec_from_file_location("ddp_demo", os.path.join(ROOT, "examples", "ddp_demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ratio,rate,expected", [
    (2.0, "1gbit", "--bandwidth 50mbit (20x)"),
    (9.9, "10gbit", "--bandwidth 500mbit (20x)"),
    (2.0, "100mbit", "--bandwidth 5mbit (20x)"),
    (2.0, "1mbit", "--bandwidth 50kbit (20x)"),
    (10.0, "1gbit", "That is about the ratio of a GPU cluster"),
    (35.0, "50mbit", "links 10-50x faster than 50mbit"),
    (2.0, None, "On loopback communication is nearly free"),
    (50.0, None, "On loopback communication is nearly free"),
])
def test_demo_ratio_advice(ratio, rate, expected):
    assert expected in _load_demo()._ratio_advice(ratio, rate)
