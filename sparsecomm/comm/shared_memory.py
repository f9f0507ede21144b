"""The dense steps inside a node through shared memory, when the node's ranks share a host.

A two-level reduction's intra-node reduce-scatter and all-gather move (L - 1)/L of every
bucket between the L ranks of a node. Between processes of one host a TCP loopback (gloo has
no shared-memory transport) copies every byte twice through the kernel and costs the ranks'
CPU: measured on 2 x 2 emulated nodes, 80-160 ms per call of a 60 MB bucket, more than the
sparse step between nodes saves (docs/two_level.md). Through one shared segment each rank
writes its gradient once and reads the slices it sums: one copy in, one read of N values,
and for the all-gather one copy of what the peers reduced -- what NVLink or PCIe give a GPU
node, on a CPU node.

The segment (``/dev/shm``) holds two buffers of L slots of the largest bucket seen, used on
alternate calls: a rank writes a buffer only after every rank passed the previous call's
barriers, so no slot is written while a peer still reads it. It is unlinked once every rank
has mapped it, and on every error of its setup (a peer that fails or dies before then makes the
creator's barrier raise); a file whose creator died before it could unlink it (its name carries
the creator's pid) is removed by the next setup on the host (:func:`remove_stale_segments`). The barriers are one
round of one-byte messages on the node's Comm: they have its deadline and its abort, so a
rank that fails between them makes its peers raise. Summation is in the message path's order
(the peers' slices in rank order, then the rank's own) (:func:`~sparsecomm.comm.collectives.direct_reduce_scatter_into_`), so both give
the same bits.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile

import torch

from .base import Comm
from .collectives import block_bounds

__all__ = ["NodeSharedMemory", "remove_stale_segments"]

#: where the segments live (a tmpfs on Linux)
SHM_DIR = "/dev/shm"
#: a segment's (or probe's) name: the creator's pid first, so a dead creator's file is found
_FILE = re.compile(r"sparsecomm-(\d+)-")
#: bytes of the probe file's name sent to the peers
_NAME = 48


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


def remove_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Unlink the segments and probes whose creator no longer runs (it died between making the
    file and unlinking it); the files of live processes stay. Returns the names removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        found = _FILE.match(name)
        if found and not _alive(int(found.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class NodeSharedMemory:
    """The intra-node reduce-scatter and all-gather of one node's Comm through a shared
    segment. Build it with :meth:`open` (collective over the node's Comm)."""

    def __init__(self, comm: Comm, base: str):
        self.comm = comm
        self._base = base               # the segment's path without its generation
        self._generation = 0
        self._capacity = 0              # bytes of one slot
        self._storage: torch.Tensor | None = None
        self._calls = 0                 # which of the two buffers this call uses

    @classmethod
    def open(cls, comm: Comm) -> "NodeSharedMemory | None":
        """A NodeSharedMemory over ``comm`` when every rank of it can map a file local rank 0
        made in ``/dev/shm`` (they share a host), else None on every rank (the ranks gather
        each one's answer). Collective over ``comm``; ``SPARSECOMM_NODE_SHM=0`` turns it off."""
        if comm.size < 2 or os.environ.get("SPARSECOMM_NODE_SHM", "1") == "0" or not os.path.isdir(SHM_DIR):
            return None
        token = torch.zeros(_NAME + 16, dtype=torch.uint8)
        made = None
        if comm.rank == 0:
            remove_stale_segments()
            fd, made = tempfile.mkstemp(prefix=f"sparsecomm-{os.getpid()}-", dir=SHM_DIR)
            secret = secrets.token_bytes(16)
            os.write(fd, secret)
            os.close(fd)
            name = os.path.basename(made).encode().ljust(_NAME, b"\0")
            token = torch.frombuffer(bytearray(name + secret), dtype=torch.uint8)
        try:
            token = comm.allgather_small(token)[0]
            name = bytes(token[:_NAME].tolist()).rstrip(b"\0").decode(errors="replace")
            secret = bytes(token[_NAME:].tolist())
            path = os.path.join(SHM_DIR, name)
            try:
                with open(path, "rb") as f:
                    same = f.read(16) == secret
            except OSError:
                same = False
            every = comm.allgather_small(torch.tensor([int(same)], dtype=torch.uint8))
        finally:
            if made is not None:   # the probe goes whether its round succeeded or not
                _unlink(made)
        if not bool(every.all()):
            return None
        return cls(comm, path)

    # -- the segment --------------------------------------------------------------------------
    def _barrier(self) -> None:
        """One round of one-byte messages with every peer (the node's Comm: deadline, abort)."""
        comm = self.comm
        peers = [q for q in range(comm.size) if q != comm.rank]
        one = torch.zeros(1, dtype=torch.uint8)
        comm.exchange([(q, one) for q in peers], [(q, torch.empty(1, dtype=torch.uint8)) for q in peers])

    def _slots(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """This call's buffer as ``[L, n]`` of ``dtype``, growing the segment when needed (every
        rank calls with the same n, agreed by the reducer's record, so they grow together)."""
        size = self.comm.size
        need = n * dtype.itemsize
        if need > self._capacity:
            capacity = -(-max(need, 2 * self._capacity) // 64) * 64   # aligned for any dtype
            self._generation += 1
            path = f"{self._base}-{self._generation}"
            nbytes = 2 * size * capacity
            creator = self.comm.rank == 0
            if creator:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.ftruncate(fd, nbytes)
                finally:
                    os.close(fd)
            try:
                self._barrier()     # made before anyone maps it
                storage = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
                self._barrier()     # mapped everywhere: the name can go
            finally:
                if creator:   # also when a peer failed or died before mapping it
                    _unlink(path)
            self._storage, self._capacity = storage, capacity
        which = self._calls % 2
        slot = self._capacity
        start = which * size * slot
        return self._storage[start:start + size * slot].view(size, slot)[:, :need].view(dtype)

    # -- the two steps ------------------------------------------------------------------------
    def reduce_scatter_into_(self, tensor: torch.Tensor, acc: torch.Tensor, own: bool = True) -> None:
        """``acc += `` the sum over the node's ranks of their slice ``rank`` of ``tensor``
        (contiguous slices whose lengths differ by at most one): the peers' in rank order, then
        this rank's own unless ``own=False`` (the caller adds it, fused with its next pass)."""
        comm = self.comm
        n = tensor.numel()
        slots = self._slots(n, tensor.dtype)
        bounds = block_bounds(n, comm.size)
        lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
        # the peers' slices only: this rank's own slice is read from the tensor itself
        slots[comm.rank, :lo].copy_(tensor[:lo])
        slots[comm.rank, hi:].copy_(tensor[hi:])
        self._barrier()
        for q in range(comm.size):
            if q != comm.rank:
                acc.add_(slots[q, lo:hi])
        if own:
            acc.add_(tensor[lo:hi])
        self._count(n - (hi - lo), tensor.dtype)

    def fence(self) -> None:
        """Wait until every rank of the node has read the slots of the last reduce-scatter: a
        reduce-scatter writes the slots its peers read, so two in a row need this between them
        (an all-gather after one writes only the parts no peer reads there)."""
        self._barrier()

    def allgather_(self, tensor: torch.Tensor) -> None:
        """Every rank's slice of ``tensor`` to every rank, in place (the owners' bytes)."""
        comm = self.comm
        n = tensor.numel()
        slots = self._slots(n, tensor.dtype)
        bounds = block_bounds(n, comm.size)
        lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
        slots[comm.rank, lo:hi].copy_(tensor[lo:hi])
        self._barrier()
        for q in range(comm.size):
            if q != comm.rank:
                tensor[bounds[q]:bounds[q + 1]].copy_(slots[q, bounds[q]:bounds[q + 1]])
        self._count((hi - lo) * (comm.size - 1), tensor.dtype)
        self._calls += 1

    def _count(self, values: int, dtype: torch.dtype) -> None:
        """Count what the peers read of this rank's slot as sent (and the same received), so a
        call's intra-node bytes read the same with or without shared memory."""
        self.comm.stats.bytes_sent += values * dtype.itemsize
        self.comm.stats.bytes_recv += values * dtype.itemsize
