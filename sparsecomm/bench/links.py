"""Bytes a rank sends inside its node and to other nodes, for the two-level benchmarks.

A two-level reducer reports its intra- and inter-node bytes itself (``last_stats``); a flat one
only knows its total. To compare the two on the link that matters -- the node's one network
link, shared by its L ranks -- :class:`LinkCounter` counts every message a Comm sends by its
destination:

* point-to-point messages (``Comm.exchange``, which ``sendrecv`` goes through, and
  ``Comm.exchange_var``, each message with its size as the Comm sends it) are counted
  exactly, by destination rank;
* the backend's own dense allreduce (``Comm.allreduce_dense``, e.g. gloo's) cannot be observed:
  its bytes are the ring count the Comm itself uses (2 (P-1) chunks of ceil(bytes / P)), all
  sent to the next rank of the Comm's group, as a ring allreduce sends them.

Under ``python -m sparsecomm.launch --nnodes n`` every node is a network namespace and its
ranks reach other nodes through one interface (``GLOO_SOCKET_IFNAME``): :func:`interface_tx_bytes`
reads that interface's transmit counter from ``/proc/net/dev`` (per namespace), the bytes that
really left the node, TCP/IP headers and retransmissions included -- the measured check of the
counted figure.
"""

from __future__ import annotations

import os
from typing import Callable

from ..comm.base import Comm, ring_allreduce_cost

__all__ = ["LinkCounter", "interface_tx_bytes"]


class LinkCounter:
    """Bytes this rank sent to ranks of its own node (``intra``) and of other nodes (``inter``)
    through the Comms it :meth:`watch`-es."""

    def __init__(self) -> None:
        self.intra = 0
        self.inter = 0

    def totals(self) -> tuple[int, int]:
        return self.intra, self.inter

    def watch(self, comm: Comm, same_node: Callable[[int], bool]) -> None:
        """Count ``comm``'s sends from now on; ``same_node(peer)`` says whether the peer (a rank
        of ``comm``) is on this rank's node. Wraps the instance's ``exchange``, ``exchange_var``
        (each message as the Comm puts it on the wire, its size included) and
        ``allreduce_dense``; the Comm works as before."""
        exchange, exchange_var, allreduce_dense = comm.exchange, comm.exchange_var, comm.allreduce_dense
        inside = []   # in an exchange_var: its own rounds are counted by it

        def counted_exchange(sends, recvs):
            exchange(sends, recvs)
            if not inside:
                for peer, payload in sends:
                    self._add(same_node(peer), payload.numel())

        def counted_exchange_var(sends, sources, **bound):
            inside.append(True)
            try:
                got = exchange_var(sends, sources, **bound)
            finally:
                inside.pop()
            for peer, payload in sends:
                self._add(same_node(peer), comm.var_message_nbytes(payload.numel()))
            return got

        def counted_allreduce_dense(tensor):
            allreduce_dense(tensor)
            sent, _ = ring_allreduce_cost(tensor.numel() * tensor.element_size(), comm.size)
            if sent:
                self._add(same_node((comm.rank + 1) % comm.size), sent)
            return tensor

        comm.exchange = counted_exchange
        comm.exchange_var = counted_exchange_var
        comm.allreduce_dense = counted_allreduce_dense

    def _add(self, same: bool, nbytes: int) -> None:
        if same:
            self.intra += nbytes
        else:
            self.inter += nbytes


def interface_tx_bytes(interface: str | None = None) -> int | None:
    """Bytes transmitted so far by ``interface`` (default ``GLOO_SOCKET_IFNAME``) in this
    process's network namespace, from ``/proc/net/dev``; None when there is no such interface
    (loopback runs, another platform)."""
    name = interface or os.environ.get("GLOO_SOCKET_IFNAME")
    if not name or name == "lo":
        return None
    try:
        with open("/proc/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return None
    for line in lines:
        label, _, counters = line.partition(":")
        if label.strip() == name:
            return int(counters.split()[8])   # receive: 8 columns, then transmit bytes
    return None
