"""``python -m sparsecomm.bench links``: measure a cluster's two links before training on it.

Run it under the launcher the training will use, with the same backend, so that it measures
what sparsecomm will measure::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m sparsecomm.bench links --backend nccl
    python -m sparsecomm.launch --nnodes 2 --nproc-per-node 2 --bandwidth 200mbit -- \\
        python -m sparsecomm.bench links

Every rank joins torch.distributed (``env://``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), builds a :class:`~sparsecomm.comm.TorchComm` and the two-level Comms of
:meth:`Topology.from_env() <sparsecomm.Topology.from_env>` (``LOCAL_WORLD_SIZE``,
``LOCAL_RANK``, ``GROUP_RANK``), and runs
:func:`sparsecomm.tune.measure_links` -- the ping-pong ``hierarchy="auto"`` decides
with: 1 KB, 64 KB and 1 MB messages, three timed round trips each after a warm-up, half the
median round trip per size, least squares on t = alpha + beta * bytes
(:func:`sparsecomm.traffic.fit_alpha_beta`). Inside a node: local ranks 0 and 1 of every node
at once; between nodes: local rank 0 of node 0 and of node 1 alone (the other ranks wait, so
the NIC carries that ping-pong only). Rank 0 prints both links' latency (alpha) and bandwidth
(1 / beta) as rank 0's fits, which every rank's reducer would use.

The first line names the shape (``links: 2 nodes x 1 rank, backend gloo``). When the nodes are
not different hosts, the next line says so: ranks of ``sparsecomm.launch`` are network namespaces of
one host (behind links shaped to its ``--bandwidth``, or plain loopback with ``--bandwidth
none``), and nodes that all report the same host name (torchrun ``--nnodes 2`` on one machine)
talk over that host's loopback, so the link "between nodes" is not the network training will use.

One node, or one rank per node, has one link: its Comm stands for the missing level too (one
ping-pong, whose fit measure_links keeps per Comm) and only that link is printed. One process has
nothing to measure and says so. Every wait ends within ``--timeout`` seconds (the process
group's rendezvous and every round of the Comm).
"""
from __future__ import annotations

import argparse
import os
import socket
import zlib
from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist

from ..tune import measure_links
from ..comm.topology import Topology
from ..comm.torch_comm import TorchComm
from ..traffic import Links

__all__ = ["main", "link_lines", "shape_text"]


def _link_text(alpha: float, beta: float) -> str:
    bits = 8 / beta if beta > 0 else float("inf")
    rate = f"{bits / 1e9:.3g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"
    return f"alpha {alpha * 1e6:.1f} us, bandwidth {rate} (beta {beta * 1e9:.3g} ns/byte)"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def shape_text(topology: Topology) -> str:
    """``2 nodes x 1 rank``: the cluster's shape, in words."""
    return f"{_plural(topology.nodes, 'node')} x {_plural(topology.ranks_per_node, 'rank')}"


def same_host_note(env: Mapping[str, str], one_host: bool) -> str | None:
    """Why the link "between nodes" is not a network, when it is not: the nodes are ranks of
    ``sparsecomm.launch`` on this host (namespaces behind shaped links, or plain loopback), or
    (``one_host``: every node reported the same host name) processes of one host. None when the
    nodes are on different hosts."""
    rate = env.get("SPARSECOMM_BANDWIDTH")
    if rate:
        return (f"the nodes share one host: emulated by sparsecomm.launch (a network namespace each, "
                f"linked at {rate})")
    if rate is not None:
        return ("the nodes share one host: sparsecomm.launch on plain loopback (--bandwidth none), so the link "
                "between nodes is this host's loopback, not a network")
    if one_host:
        return ("the nodes share one host (every node reported the same host name; no launcher across hosts): "
                "the link between nodes is this host's loopback, not a network")
    return None


def link_lines(topology: Topology, links: Links, backend: str, one_host: bool = False,
               env: Mapping[str, str] | None = None) -> list[str]:
    """What rank 0 prints for ``links`` measured on ``topology``; ``one_host``: every node is on
    the same host (``env``, default ``os.environ``, says whether sparsecomm.launch emulates them)."""
    lines = [f"links: {shape_text(topology)}, backend {backend}"]
    if topology.nodes > 1:
        note = same_host_note(os.environ if env is None else env, one_host)
        if note:
            lines.append(note)
        lines.append(f"between nodes (local rank 0 of node 0 <-> local rank 0 of node 1): "
                     f"{_link_text(links.alpha, links.beta)}")
    else:
        lines.append("between nodes: one node, nothing to measure")
    if topology.ranks_per_node > 1:
        lines.append(f"inside a node (local rank 0 <-> local rank 1): {_link_text(links.intra_alpha, links.intra_beta)}")
    else:
        lines.append("inside a node: one rank per node, nothing to measure")
    return lines


def _one_host(backend: str) -> bool:
    """Whether every rank runs on the same host (the same host name), from a checksum of each
    rank's host name all-gathered as one int64 (collective: every rank calls it)."""
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    mine = torch.tensor([zlib.crc32(socket.gethostname().encode())], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return len({int(t.item()) for t in every}) == 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench links", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Run one process per rank under torchrun, srun or mpirun (see docs/multinode.md).")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                    help="torch.distributed backend, the one training uses (nccl: each rank on cuda:LOCAL_RANK)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds any wait may take: the rendezvous and each round (default 120)")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.timeout <= 0:
        _parser().error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    world_size = os.environ.get("WORLD_SIZE", "")
    if world_size in ("", "1"):
        print("links: one process, nothing to measure: start one process per rank under a launcher "
              "(torchrun --nnodes N --nproc-per-node L -m sparsecomm.bench links, or "
              "python -m sparsecomm.launch --nnodes 2 --nproc-per-node 2 -- python -m sparsecomm.bench links)",
              flush=True)
        return 0
    try:
        topology = Topology.from_env()
    except ValueError as exc:
        print(f"links: {exc} (LOCAL_WORLD_SIZE = ranks per node, GROUP_RANK = this node's index; torchrun "
              "sets them, under mpirun see docs/multinode.md)", flush=True)
        return 2
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            print("links: --backend nccl needs CUDA on every rank; use --backend gloo", flush=True)
            return 2
        torch.cuda.set_device(topology.place(int(os.environ.get("RANK", "0")))[1])
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    try:
        world = TorchComm(timeout=args.timeout)
        try:
            nodes = topology.split(world)
            try:
                # one level only: its Comm stands for the missing one too (fitted once, then cached)
                intra = nodes.inter if nodes.intra is None else nodes.intra
                inter = nodes.intra if nodes.inter is None else nodes.inter
                links = measure_links(world, intra, inter)
            finally:
                nodes.close()
        finally:
            world.close()
        one_host = _one_host(args.backend)
        if dist.get_rank() == 0:
            print("\n".join(link_lines(nodes.topology, links, args.backend, one_host)), flush=True)
    finally:
        dist.destroy_process_group()
    return 0
