"""The README's demo runs end to end (small settings) and prints its comparison table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ddp_demo_prints_a_row_per_algorithm():
    algorithms = ["dense", "topka", "spardl"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--nproc", "2",
                           "--steps", "6", "--hidden", "64", "--batch", "16", "--bandwidth", "none",
                           "--algorithms", *algorithms],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {m.group(1): m for m in re.finditer(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \| ([\d.]+) MB \| "
                                               r"([\d.]+)% \|$", proc.stdout, re.MULTILINE)}
    assert sorted(rows) == sorted(algorithms), proc.stdout
    assert float(rows["dense"].group(5)) > 10 * float(rows["topka"].group(5)), "topka should send far fewer bytes"
    assert "GENERATED data" in proc.stdout


def test_ddp_demo_rejects_unknown_algorithm():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--algorithms", "nope"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "unknown algorithm 'nope'" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None,
                    reason="emulating links needs root and iproute2 (ip, tc)")
def test_ddp_demo_runs_on_the_emulated_network():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ddp_demo.py"), "--nproc", "2",
                           "--steps", "5", "--hidden", "64", "--batch", "16", "--algorithms", "dense", "topka"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "emulated 1gbit network" in proc.stdout and "(network interface eth0)" in proc.stdout
    assert "[rank 0] | topka | 0.01 |" in proc.stdout
