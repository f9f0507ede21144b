"""``python -m sparsecomm.bench links``: the link check a user runs under their own launcher.

Two real runs: two plain gloo processes started here with torchrun's variables (one node of two
ranks: only the link inside a node), and 2 nodes x 2 ranks under the emulated launcher at
200 Mbit/s between nodes, where the shaped link must come out near its rate and slower than
the loopback inside a node.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from sparsecomm.bench.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAN_SHAPE = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None

LINK = re.compile(r"(between nodes|inside a node) \(.*\): alpha ([\d.]+) us, bandwidth ([\d.]+) (Gbit|Mbit)/s "
                  r"\(beta ([\d.e+-]+) ns/byte\)")


def _links(text: str) -> dict[str, tuple[float, float, float]]:
    """{link: (alpha s, bits/s, beta s/byte)} of every printed link line."""
    found = {}
    for where, alpha, rate, unit, beta in LINK.findall(text):
        found[where] = (float(alpha) * 1e-6, float(rate) * (1e9 if unit == "Gbit" else 1e6), float(beta) * 1e-9)
    return found


def _check_fit(alpha: float, bits: float, beta: float) -> None:
    assert alpha >= 0 and bits > 0 and beta > 0
    # the printed bandwidth is 8 bits / beta, to the printed 3 digits
    assert bits == pytest.approx(8 / beta, rel=0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_process_has_nothing_to_measure(monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["links"]) == 0
    assert "one process, nothing to measure" in capsys.readouterr().out


def test_two_gloo_processes_measure_the_link_inside_their_node():
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", GROUP_RANK="0", GLOO_SOCKET_IFNAME="lo",
                   PYTHONPATH=ROOT)
        procs.append(subprocess.Popen([sys.executable, "-m", "sparsecomm.bench", "links", "--timeout", "60"],
                                      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "links: 1 node x 2 ranks, backend gloo" in outs[0], outs[0]
    assert "between nodes: one node, nothing to measure" in outs[0]
    links = _links(outs[0])
    assert list(links) == ["inside a node"], outs[0]
    _check_fit(*links["inside a node"])
    assert outs[1].strip() == "", "only rank 0 prints"


@pytest.mark.skipif(not CAN_SHAPE, reason="emulating links needs root and iproute2 (ip, tc)")
def test_the_shaped_link_between_nodes_is_near_its_rate_and_slower_than_loopback():
    cmd = [sys.executable, "-m", "sparsecomm.launch", "--nnodes", "2", "--nproc-per-node", "2", "--bandwidth",
           "200mbit", "--", sys.executable, "-m", "sparsecomm.bench", "links", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] links: 2 nodes x 2 ranks, backend gloo" in proc.stdout, proc.stdout
    links = _links(proc.stdout)
    assert sorted(links) == ["between nodes", "inside a node"], proc.stdout
    for fit in links.values():
        _check_fit(*fit)
    between, inside = links["between nodes"][1], links["inside a node"][1]
    # tbf lets a burst of 256 KB through faster than the rate: the 1 MB fit comes out above it
    assert 100e6 < between < 400e6, proc.stdout
    assert inside > 4 * between, proc.stdout


def test_the_shape_is_in_words_and_nodes_of_one_host_are_named_as_such():
    from sparsecomm import Topology
    from sparsecomm.bench.linkcheck import link_lines
    from sparsecomm.traffic import Links

    links = Links(alpha=1e-4, beta=8e-9, intra_alpha=1e-5, intra_beta=1e-10)
    lines = link_lines(Topology(2, 1), links, "gloo", one_host=False, env={})
    assert lines[0] == "links: 2 nodes x 1 rank, backend gloo"
    assert lines[1].startswith("between nodes (local rank 0 of node 0 <-> local rank 0 of node 1): alpha 100.0 us")
    assert link_lines(Topology(1, 2), links, "gloo", env={})[0] == "links: 1 node x 2 ranks, backend gloo"
    # torchrun --nnodes 2 on one machine: every node reports the same host name
    assert link_lines(Topology(2, 2), links, "gloo", one_host=True, env={})[1] == (
        "the nodes share one host (every node reported the same host name; no launcher across hosts): the link "
        "between nodes is this host's loopback, not a network")
    assert link_lines(Topology(2, 2), links, "gloo", one_host=True, env={"SPARSECOMM_BANDWIDTH": "200mbit"})[1] == (
        "the nodes share one host: emulated by sparsecomm.launch (a network namespace each, linked at 200mbit)")
    # one node: nothing between nodes, so nothing to say about hosts
    assert link_lines(Topology(1, 2), links, "gloo", one_host=True, env={})[1] == \
        "between nodes: one node, nothing to measure"


@pytest.mark.skipif(not CAN_SHAPE, reason="the launcher's nodes need root and iproute2 (ip, tc)")
def test_the_launchers_loopback_nodes_are_said_to_share_one_host():
    cmd = [sys.executable, "-m", "sparsecomm.launch", "--nproc", "2", "--bandwidth", "none", "--",
           sys.executable, "-m", "sparsecomm.bench", "links", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] links: 2 nodes x 1 rank, backend gloo\n" in proc.stdout, proc.stdout
    assert ("[rank 0] the nodes share one host: sparsecomm.launch on plain loopback (--bandwidth none), so the "
            "link between nodes is this host's loopback, not a network\n") in proc.stdout, proc.stdout
