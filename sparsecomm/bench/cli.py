"""Benchmark CLI: ``python -m sparsecomm.bench collectives ...``, ``... kernels ...``, ``... accuracy ...``, ``... phases ...``, ``... scale ...``, ``... links ...`` and ``... balance ...``.

``collectives`` checks, then times, every sparse allreduce algorithm on real ranks
(:mod:`sparsecomm.bench.collectives`).

``accuracy`` is the time-to-accuracy benchmark (:mod:`sparsecomm.bench.accuracy`): every
method trains a task from the same weights, interleaved, to a target accuracy.

``kernels`` forwards its arguments to :func:`sparsecomm.bench.kernels.main` (the CPU kernel
benchmark, part of the package so that it runs from an installed wheel too); ``phases`` to
:func:`sparsecomm.bench.phases.main` (a call's local compute by phase, in residual-add passes);
``scale`` to :func:`sparsecomm.bench.scale.main` (the traffic-only scale study, docs/scale.md);
``links`` to :func:`sparsecomm.bench.linkcheck.main` (a cluster's latency and bandwidth between
and inside nodes, under the user's launcher: docs/multinode.md); ``balance`` to
:func:`sparsecomm.bench.balance.main` (bytes per rank and phase of each algorithm on real top-k
gradients: how evenly the owners share the work, docs/zen.md).
"""
from __future__ import annotations

import sys

from . import accuracy, balance, collectives, kernels, linkcheck, phases, scale

__all__ = ["main"]


def _kernels(argv) -> int:
    kernels.main(list(argv))   # returns its rows, not an exit status
    return 0


COMMANDS = {"collectives": collectives.main, "kernels": _kernels, "accuracy": accuracy.main, "phases": phases.main,
            "scale": scale.main, "links": linkcheck.main, "balance": balance.main}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.split("\n")[0] + "\n\nusage: python -m sparsecomm.bench {collectives,kernels,accuracy,phases,scale,links,balance} [options]"
              "\n(add --help after the command for its options)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](list(argv[1:]))
