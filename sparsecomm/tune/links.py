"""Link measurement for the tuner: one ping-pong through a Comm, its alpha-beta fit kept per
Comm, and the two links of a cluster of nodes.

``auto`` fits the link its candidates run on once per Comm (every reducer on that Comm reuses
the fit; every rank builds reducers in the same order), ``hierarchy="auto"`` measures both
levels of a cluster (:func:`measure_links`), and ``bench collectives`` reports the same
ping-pong's half round trips (:func:`pingpong`). Every rank gets rank 0's figures, so a decision
made from them is the same everywhere.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Any, Callable, Sequence

import torch

from ..traffic import Links, fit_alpha_beta

__all__ = ["pingpong", "link_fit", "measure_links", "FIT_SIZES"]

#: the message sizes of the tuner's ping-pong (bytes)
FIT_SIZES = (1 << 10, 1 << 16, 1 << 20)

# one fit per Comm (every reducer on it reuses it; every rank builds reducers in the same order)
_FITS: "weakref.WeakKeyDictionary[Any, tuple[float, float]]" = weakref.WeakKeyDictionary()


def pingpong(comm, sizes: Sequence[int], peer: int = 1, trips: Callable[[int], int] = lambda size: 3,
             before_size: Callable[[], None] | None = None) -> list[float]:
    """Median half round trip (seconds) per size between ranks 0 and ``peer`` of ``comm``,
    rank 0's figures on every rank (all-gathered; the other ranks only wait). ``trips(size)``
    timed round trips per size, after one that warms the connection up; ``before_size`` runs on
    every rank before each size (a barrier, so that no rank's earlier work overlaps it)."""
    halves = []
    for size in sizes:
        buf = torch.zeros(size, dtype=torch.uint8, device=comm.device)
        if before_size is not None:
            before_size()
        times = []
        for trip in range(trips(size) + 1):   # the first trip warms the connection up
            start = time.perf_counter()
            if comm.rank == 0:
                comm.exchange([(peer, buf)], [])
                comm.exchange([], [(peer, buf)])
            elif comm.rank == peer:
                comm.exchange([], [(0, buf)])
                comm.exchange([(0, buf)], [])
            if trip:
                times.append((time.perf_counter() - start) / 2)
        halves.append(statistics.median(times) if comm.rank == 0 else 0.0)
    table = comm.allgather_small(torch.tensor(halves, dtype=torch.float64, device="cpu")).cpu()
    return table[0].tolist()


def _fit(comm) -> tuple[float, float]:
    """Rank 0's alpha-beta fit of a ping-pong with rank 1, the same on every rank."""
    halves = pingpong(comm, FIT_SIZES)
    return fit_alpha_beta(list(FIT_SIZES), halves)


def link_fit(comm) -> tuple[float, float]:
    """``comm``'s (alpha, beta), measured by the first call on it (collective then) and kept:
    ``(0, 0)`` on one rank."""
    if comm.size < 2:
        return 0.0, 0.0
    fit = _FITS.get(comm)
    if fit is None:
        fit = _FITS[comm] = _fit(comm)
    return fit


def measure_links(world, intra, inter) -> Links:
    """The two links of a cluster, the same on every rank: a ping-pong inside every node at once
    on ``intra`` (the node's Comm; its links are the node's own), then one between the first two
    nodes on the ``inter`` Comm of local rank 0 only (the other local ranks wait, so the NIC
    carries that ping-pong alone), then world rank 0's four values all-gathered on ``world``.
    Collective over ``world``."""
    intra_fit = link_fit(intra)
    inter_fit = link_fit(inter) if intra.rank == 0 else (0.0, 0.0)
    mine = torch.tensor([inter_fit[0], inter_fit[1], intra_fit[0], intra_fit[1]], dtype=torch.float64)
    values = world.allgather_small(mine).cpu()[0].tolist()
    return Links(*values)
