"""The launcher: ranks over an emulated 1 Gbit/s network, failure propagation, cleanup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from sparsecomm.launch import parse_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAN_SHAPE = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_shaping = pytest.mark.skipif(not CAN_SHAPE, reason="emulating links needs root and iproute2 (ip, tc)")

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    mode = sys.argv[1]
    if mode == "fail" and os.environ["RANK"] == "1":
        print("rank 1 fails on purpose", flush=True)
        sys.exit(3)
    if mode == "fail":
        time.sleep(120)  # must be stopped by the launcher, not waited for
    dist.init_process_group("gloo")
    payload = torch.zeros(12_500_000, dtype=torch.uint8)  # 100 Mbit
    dist.barrier()
    start = time.perf_counter()
    if dist.get_rank() == 0:
        dist.send(payload, 1)
    elif dist.get_rank() == 1:
        dist.recv(payload, 0)
    dist.barrier()
    seconds = time.perf_counter() - start
    print(f"ifname={os.environ['GLOO_SOCKET_IFNAME']} world={dist.get_world_size()} gbit_s={0.1 / seconds:.3f}")
    dist.destroy_process_group()
""")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _launch(tmp_path, bandwidth: str, mode: str, nproc: int = 2, timeout: float = 120):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sparsecomm.launch", "--nproc", str(nproc), "--bandwidth", bandwidth,
                           "--", sys.executable, str(script), mode],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc, time.monotonic() - start


@needs_shaping
def test_shaped_link_runs_ranks_at_the_given_rate_and_cleans_up(tmp_path):
    before = _namespaces()
    proc, _ = _launch(tmp_path, "1gbit", "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "gbit_s=" in line]
    assert sorted(line.split("]")[0] for line in lines) == ["[rank 0", "[rank 1"]
    assert "ifname=eth0" in proc.stdout and "ifname=eth1" in proc.stdout
    rate = min(float(line.rsplit("gbit_s=", 1)[1]) for line in lines)
    assert 0.5 < rate < 1.1, f"expected about 1 Gbit/s through the shaped link, measured {rate}"
    assert _namespaces() == before


@needs_shaping
def test_failing_rank_fails_the_launch_and_leaves_no_namespace(tmp_path):
    before = _namespaces()
    proc, seconds = _launch(tmp_path, "1gbit", "fail")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "[rank 1] rank 1 fails on purpose" in proc.stdout
    assert "rank 1 exited with 3" in proc.stdout
    assert seconds < 60, "the sleeping rank was waited for instead of stopped"
    assert _namespaces() == before


def test_loopback_mode_needs_no_privileges(tmp_path):
    proc, _ = _launch(tmp_path, "none", "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ifname=lo world=2") == 2


@pytest.mark.parametrize("text,expected", [("1gbit", "1gbit"), ("100MBIT", "100mbit"), ("none", None)])
def test_rate_parsing(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["1gb", "fast", "", "-1gbit"])
def test_bad_rate_is_rejected(text):
    with pytest.raises(Exception, match="bandwidth must look like"):
        parse_rate(text)
