"""The node's dense steps through shared memory (sparsecomm/comm/shared_memory.py), with real
gloo ranks on one host: the same bits as the message path, nothing left in /dev/shm, and a
rank failing between its barriers releases its node's peers."""

from __future__ import annotations

import os
import time

import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm.shared_memory import SHM_DIR
from sparsecomm.testing import spawn

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm")


def _ours() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith("sparsecomm-")}


def _both_paths(rank, world_size, algorithm, n, dtype):
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    shared = sc.Topology(2, 2).split(comm)
    os.environ["SPARSECOMM_NODE_SHM"] = "0"
    try:
        messages = sc.Topology(2, 2).split(comm)
    finally:
        del os.environ["SPARSECOMM_NODE_SHM"]
    a = sc.SparseAllreduce(algorithm, 0.05, comm, hierarchy="node", nodes=shared)
    b = sc.SparseAllreduce(algorithm, 0.05, comm, hierarchy="node", nodes=messages)
    same = True
    for step in range(3):
        # a larger tensor on the last call: the segment grows
        size = n if step < 2 else 3 * n
        g = torch.randn(size, generator=torch.Generator().manual_seed(10 * rank + step)).to(dtype)
        x, y = a(g), b(g)
        same = same and torch.equal(x.view(torch.uint8), y.view(torch.uint8)) \
            and torch.equal(a.residual, b.residual)
        if step == 1:   # the residual is summed with the node's slices on the second call; a new N next
            a.reset(), b.reset()
    return same, shared.shared is not None, messages.shared is None


@pytest.mark.distributed
@pytest.mark.parametrize("algorithm, dtype", [("topka", torch.float32), ("spardl", torch.bfloat16),
                                              ("dense", torch.float64)])
def test_shared_memory_gives_the_bits_of_the_message_path_and_leaves_nothing(algorithm, dtype):
    before = _ours()
    results = spawn(_both_paths, 4, algorithm, 10_007, dtype, timeout=120)
    assert all(uses for _, uses, _ in results), "the node's ranks share a host: shared memory expected"
    assert all(off for _, _, off in results), "SPARSECOMM_NODE_SHM=0 must keep the messages"
    assert all(same for same, _, _ in results)
    assert _ours() <= before, f"left in {SHM_DIR}: {_ours() - before}"


def _fails_between_barriers(rank, world_size):
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    nodes = sc.Topology(2, 2).split(comm)
    assert nodes.shared is not None
    reducer = sc.SparseAllreduce("topka", 0.05, comm, hierarchy="node", nodes=nodes)
    reducer(torch.ones(1000))
    if rank == 1:   # after the node's reduce-scatter, before its all-gather: rank 0 waits at the barrier
        def broken(*args, **kwargs):
            raise RuntimeError("injected")
        reducer.algorithm.reduce = broken
    start = time.monotonic()
    try:
        reducer(torch.ones(1000))
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        if rank == 1:
            time.sleep(4)   # stay alive: only the abort can release the peers
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None


@pytest.mark.distributed
def test_a_rank_failing_between_the_barriers_releases_its_peers():
    results = spawn(_fails_between_barriers, 4, timeout=120)
    assert results[1][0] == "RuntimeError"
    for rank in (0, 2, 3):
        name, text, waited = results[rank]
        assert name.startswith("Comm") and "rank 1" in text, results[rank]
        assert waited < 3.0, results[rank]


#: where a rank dies in the segment's setup: (dying rank, what it does last)
DEATHS = [
    (0, "probe made"),         # local rank 0 made the probe file, before the peers read its name
    (1, "barrier 1"),          # a peer, before the segment's first barrier (made, not yet mapped)
    (0, "barrier 1"),          # local rank 0, after making the segment, before the first barrier
    (1, "barrier 2"),          # a peer that mapped it, before the second barrier
    (0, "after barrier 2"),    # local rank 0, between the second barrier and the unlink
]


def _dies_in_setup(rank, world_size, dying, where):
    import tempfile

    from sparsecomm.comm import shared_memory
    from sparsecomm.comm.torch_comm import TorchComm

    if rank == dying and where == "probe made":
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*args, **kwargs):
            made = real_mkstemp(*args, **kwargs)
            os._exit(0)
            return made
        shared_memory.tempfile.mkstemp = mkstemp
    real_barrier, calls = shared_memory.NodeSharedMemory._barrier, [0]

    def barrier(self):
        calls[0] += 1
        if rank == dying and where == f"barrier {calls[0]}":
            os._exit(0)
        real_barrier(self)
        if rank == dying and where == f"after barrier {calls[0]}":
            os._exit(0)
    shared_memory.NodeSharedMemory._barrier = barrier
    comm = TorchComm(timeout=20)
    try:
        nodes = sc.Topology(1, 2).split(comm)
        sc.SparseAllreduce("topka", 0.05, comm, hierarchy="node", nodes=nodes)(torch.ones(1000))
    except Exception as exc:  # noqa: BLE001 - the survivor's error is the result
        return type(exc).__name__
    return None


def _setup_once(rank, world_size):
    from sparsecomm.comm.torch_comm import TorchComm

    return sc.Topology(1, 2).split(TorchComm(timeout=20)).shared is not None


@pytest.mark.distributed
@pytest.mark.parametrize("dying, where", DEATHS)
def test_a_rank_dying_in_the_setup_leaves_no_segment_behind(dying, where):
    """A rank of the node killed at each step of the segment's setup: the survivor raises, and no
    file stays in /dev/shm once the next setup on the host has run (the creator unlinks it on
    every error of its own; a file of a creator that died is removed by the next setup). Before,
    4 of 4 such runs left the segment (2 x L x the largest bucket) in the tmpfs."""
    before = _ours()
    results = spawn(_dies_in_setup, 2, dying, where, timeout=120, may_die=(dying,))
    survivor = 1 - dying
    assert results[survivor] is not None and results[survivor].startswith("Comm"), results
    if dying == 1:   # the creator lived: it unlinked the segment on its own error
        assert _ours() <= before, f"left in {SHM_DIR}: {_ours() - before}"
    assert all(spawn(_setup_once, 2, timeout=120)), "the next setup maps a segment again"
    assert _ours() <= before, f"left in {SHM_DIR} after the next setup: {_ours() - before}"
