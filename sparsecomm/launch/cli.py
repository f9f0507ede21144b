"""The command line, ``python -m sparsecomm.launch [--nproc P | --nnodes N --nproc-per-node L] ... -- CMD``.

:func:`main` parses it, checks that the cluster's shape adds up (:func:`_cluster_shape`) and
that mpirun and network namespaces are there when asked for, runs :func:`launch` and turns
its errors into one line and exit status 2. The internal ``--mpi-rank`` re-entry is handed to
:func:`~sparsecomm.launch.rank._mpi_rank`.
"""

from __future__ import annotations

import argparse
import sys

from .link import parse_rate
from .mpi import find_mpirun
from .network import EmulatedNetwork, LaunchError, NetworkSetupError
from .rank import _MPI_RANK, _mpi_rank
from .supervision import launch


def _cluster_shape(parser: argparse.ArgumentParser, nproc: int | None, nnodes: int | None,
                   per_node: int | None) -> tuple[int, int]:
    """(nodes, ranks per node) from --nproc / --nnodes / --nproc-per-node, or a parser error."""
    for flag, value in (("--nproc", nproc), ("--nnodes", nnodes), ("--nproc-per-node", per_node)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if nproc is None and nnodes is None:
        parser.error("give --nproc P (P nodes of one rank) or --nnodes N [--nproc-per-node L]")
    if nproc is None:
        return nnodes, per_node or 1
    if nnodes is None and per_node is None:
        return nproc, 1
    nnodes = nnodes if nnodes is not None else nproc // per_node
    per_node = per_node if per_node is not None else nproc // nnodes
    if nnodes * per_node != nproc:
        parser.error(f"--nproc {nproc} is not --nnodes x --nproc-per-node ({nnodes} x {per_node}); "
                     "give --nnodes and --nproc-per-node alone, or values whose product is --nproc")
    return nnodes, per_node


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_MPI_RANK]:
        return _mpi_rank(argv[1:])
    # the manual is the package's docstring, read here: the package imports this module
    manual = sys.modules[__package__].__doc__
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.launch", description=manual,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, help="number of ranks, one per node (--nnodes P --nproc-per-node 1)")
    parser.add_argument("--nnodes", type=int, help="number of nodes, each with its own shaped link")
    parser.add_argument("--nproc-per-node", type=int, help="ranks per node, sharing its link (default 1)")
    parser.add_argument("--bandwidth", type=parse_rate, default="1gbit",
                        help="link rate per node (tc syntax, e.g. 1gbit, 100mbit) or 'none' for loopback")
    parser.add_argument("--backend", choices=["gloo", "mpi"], default="gloo",
                        help="how the ranks start: gloo (one process each, torchrun-style variables) "
                             "or mpi (one Open MPI mpirun, the same variables too)")
    parser.add_argument("--port", type=int, default=29500, help="MASTER_PORT")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- followed by the command each rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to run after --")
    nnodes, per_node = _cluster_shape(parser, args.nproc, args.nnodes, args.nproc_per_node)
    if args.backend == "mpi":
        try:
            find_mpirun()
        except LaunchError as exc:
            print(f"sparsecomm.launch: {exc}", file=sys.stderr)
            return 2
    if args.bandwidth:
        try:
            EmulatedNetwork.check_possible()
        except NetworkSetupError as exc:
            print(f"sparsecomm.launch: cannot emulate a {args.bandwidth} network here ({exc}); "
                  "rerun with --bandwidth none to use plain loopback", file=sys.stderr)
            return 2
    try:
        return launch(cmd, nnodes * per_node, args.bandwidth, args.port, backend=args.backend,
                      nproc_per_node=per_node)
    except NetworkSetupError as exc:
        print(f"sparsecomm.launch: {exc}; rerun with --bandwidth none to use plain loopback", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"sparsecomm.launch: {exc}", file=sys.stderr)
        return 2
