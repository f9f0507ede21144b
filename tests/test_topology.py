"""Where the ranks sit: :class:`sparsecomm.Topology` (from torchrun's environment or given),
its :meth:`~sparsecomm.Topology.split` into the intra-node and inter-node groups, and
:meth:`Comm.split` on every backend (simulated, gloo processes, mpirun).

The expected groups are written here from the layout alone: node ``j``'s ranks are
``j*L .. j*L + L - 1`` (torchrun's numbering) and the inter-node group of local rank ``l`` is
``l, L + l, 2L + l, ...``. Each group's membership is proven by communicating on it: every
rank all-gathers its world rank over the group.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from sparsecomm import Topology
from sparsecomm.comm import simulate
from sparsecomm.comm.base import CommAbortedError

SHAPES = [(1, 2), (2, 1), (2, 2), (3, 2), (2, 3)]

TORCHRUN = {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "RANK": "5", "LOCAL_RANK": "2", "GROUP_RANK": "1"}


def _expected_groups(nodes: int, per: int) -> tuple[list[list[int]], list[list[int]]]:
    intra = [[node * per + local for local in range(per)] for node in range(nodes)]
    inter = [[node * per + local for node in range(nodes)] for local in range(per)]
    return intra, inter


# -- Topology.from_env ---------------------------------------------------------------------
def test_from_env_reads_torchrun_variables():
    t = Topology.from_env(TORCHRUN)
    assert (t.nodes, t.ranks_per_node, t.node, t.local_rank, t.size) == (2, 3, 1, 2, 6)
    assert str(t) == "2 nodes x 3 ranks"


def test_from_env_falls_back_to_node_rank_then_rank():
    env = {k: v for k, v in TORCHRUN.items() if k != "GROUP_RANK"}
    # the given places win over RANK's layout (RANK=5 would be node 1)
    t = Topology.from_env({**env, "NODE_RANK": "0", "LOCAL_RANK": "2"})
    assert (t.node, t.local_rank) == (0, 2)
    # neither GROUP_RANK nor NODE_RANK: torchrun's layout from RANK (4 = node 1, local rank 1 of 3)
    t = Topology.from_env({**{k: v for k, v in env.items() if k != "LOCAL_RANK"}, "RANK": "4"})
    assert (t.nodes, t.ranks_per_node, t.node, t.local_rank) == (2, 3, 1, 1)
    # an empty variable counts as unset (launchers export empty ones)
    t = Topology.from_env({**env, "GROUP_RANK": "", "NODE_RANK": "0", "LOCAL_RANK": "1"})
    assert (t.node, t.local_rank) == (0, 1)


@pytest.mark.parametrize("change, words", [
    ({"WORLD_SIZE": None}, "WORLD_SIZE and LOCAL_WORLD_SIZE are not set"),
    ({"LOCAL_WORLD_SIZE": None}, "WORLD_SIZE and LOCAL_WORLD_SIZE are not set"),
    ({"LOCAL_WORLD_SIZE": "two"}, "LOCAL_WORLD_SIZE='two' is not an integer"),
    ({"GROUP_RANK": "1.0"}, "GROUP_RANK='1.0' is not an integer"),
    ({"LOCAL_WORLD_SIZE": "4"}, "WORLD_SIZE=6 is not a multiple of LOCAL_WORLD_SIZE=4"),
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0"),
    ({"LOCAL_WORLD_SIZE": "-3"}, "LOCAL_WORLD_SIZE=-3"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"LOCAL_RANK": "3"}, "LOCAL_RANK=3 is not in [0, LOCAL_WORLD_SIZE=3)"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1"),
    ({"GROUP_RANK": "2"}, "GROUP_RANK=2 is not in [0, 2)"),
    ({"GROUP_RANK": None, "NODE_RANK": "5"}, "NODE_RANK=5"),
    ({"RANK": "6", "GROUP_RANK": None, "LOCAL_RANK": None}, "RANK=6"),
    ({"RANK": None, "GROUP_RANK": None}, "nor RANK is set"),
])
def test_from_env_refuses_missing_or_inconsistent_variables(change, words):
    env = {**TORCHRUN, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ValueError, match="Topology.from_env") as info:
        Topology.from_env(env)
    assert words in str(info.value), str(info.value)


def test_from_env_defaults_to_the_process_environment(monkeypatch):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NODE_RANK", raising=False)
    assert Topology.from_env() == Topology(2, 3, 1, 2)


# -- explicit topologies -------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    ((0, 2), "nodes must be an integer >= 1"),
    ((2, 0), "ranks_per_node must be an integer >= 1"),
    ((True, 2), "nodes must be an integer >= 1"),
    ((2.0, 2), "nodes must be an integer >= 1"),
    ((2, 2, 1, None), "give both node and local_rank, or neither"),
    ((2, 2, None, 0), "give both node and local_rank, or neither"),
    ((2, 2, 2, 0), "node must be in [0, 2)"),
    ((2, 2, 0, 2), "local_rank must be in [0, 2)"),
    ((2, 2, -1, 0), "node must be in [0, 2)"),
])
def test_explicit_topology_is_validated(args, words):
    with pytest.raises(ValueError) as info:
        Topology(*args)
    assert words in str(info.value)


def test_place_follows_torchrun_layout_unless_given():
    assert [Topology(3, 2).place(r) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert Topology(3, 2, node=2, local_rank=0).place(1) == (2, 0)


# -- Topology.split over simulated worlds ---------------------------------------------------
@pytest.mark.parametrize("nodes, per", SHAPES)
def test_split_builds_the_intra_and_inter_node_groups(nodes, per):
    intra, inter = _expected_groups(nodes, per)

    def checked(comm):
        split = Topology(nodes, per).split(comm)
        me = torch.tensor(comm.rank)
        got_intra = None if split.intra is None else split.intra.allgather_small(me).tolist()
        got_inter = None if split.inter is None else split.inter.allgather_small(me).tolist()
        return (split.topology.node, split.topology.local_rank, got_intra, got_inter,
                None if split.intra is None else split.intra.rank, None if split.inter is None else split.inter.rank,
                len(split.comms), split.world is comm)

    for r, (node, local, got_intra, got_inter, intra_rank, inter_rank, ncomms, same) in \
            enumerate(simulate(nodes * per, checked).results):
        assert (node, local) == divmod(r, per)
        assert got_intra == (intra[node] if per > 1 else None)      # L = 1: no intra-node Comm
        assert got_inter == (inter[local] if nodes > 1 else None)   # n = 1: no inter-node Comm
        assert intra_rank == (local if per > 1 else None) and inter_rank == (node if nodes > 1 else None)
        assert ncomms == 1 + (per > 1) + (nodes > 1) and same


def test_split_follows_given_places_not_rank_order():
    """Ranks placed round-robin (rank r on node r % 2): the groups follow the places."""
    def rank(comm):
        split = Topology(2, 3, node=comm.rank % 2, local_rank=comm.rank // 2).split(comm)
        me = torch.tensor(comm.rank)
        return split.intra.allgather_small(me).tolist(), split.inter.allgather_small(me).tolist()

    results = simulate(6, rank).results
    for r, (got_intra, got_inter) in enumerate(results):
        assert got_intra == [r % 2, r % 2 + 2, r % 2 + 4]
        assert got_inter == [2 * (r // 2), 2 * (r // 2) + 1]


def _errors_on_every_rank(size: int, topology_of) -> list[str]:
    def rank(comm):
        try:
            topology_of(comm.rank).split(comm)
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    return simulate(size, rank, timeout=10).results


@pytest.mark.parametrize("case, size, topology_of, words", [
    ("another shape on one rank", 4, lambda r: Topology(1, 4) if r == 2 else Topology(2, 2),
     "the ranks disagree on the topology (rank 0 says 2 nodes x 2; rank 1 says 2 nodes x 2; rank 2 says 1 nodes x 4"),
    ("flat on one rank", 4, lambda r: Topology(4, 1) if r == 0 else Topology(2, 2),
     "the ranks disagree on the topology (rank 0 says 4 nodes x 1"),
    ("nodes of unequal size", 5, lambda r: Topology(2, 2, min(r // 2, 1), r % 2 if r < 4 else 1),
     "the topology 2 nodes x 2 ranks has 4 ranks but the group has 5"),
    ("two ranks in one place", 4, lambda r: Topology(2, 2, 1, 1) if r == 0 else Topology(2, 2),
     "ranks 0 and 3 both say they are local rank 1 of node 1"),
])
def test_disagreeing_ranks_raise_the_same_error_on_every_rank(case, size, topology_of, words):
    """Never a hang nor a rank that goes on: every rank raises, with the same text."""
    errors = _errors_on_every_rank(size, topology_of)
    assert all(e is not None for e in errors), (case, errors)
    assert len(set(errors)) == 1, (case, errors)
    assert words in errors[0], errors[0]


# -- Comm.split on a simulated world -------------------------------------------------------
def test_simcomm_split_groups_clocks_and_intra_node_link():
    """A local group uses the world's intra-node link, another group the world's link; the
    group's rank shares its clock with the world rank (what a rank spends on one Comm is
    spent); messages of two groups never mix although they use the same tags."""
    alpha, beta, intra_alpha, intra_beta, nbytes = 1e-3, 1e-6, 1e-5, 1e-8, 1000

    def rank(comm):
        fast = comm.split([[0, 1], [2, 3]], local=True)
        slow = comm.split([[0, 2], [1, 3]])
        out = {"fast": (fast.rank, fast.size), "slow": (slow.rank, slow.size)}
        payload = torch.full((nbytes,), comm.rank, dtype=torch.uint8)
        got = torch.empty(nbytes, dtype=torch.uint8)
        t0 = comm.clock
        fast.exchange([(1 - fast.rank, payload)], [(1 - fast.rank, got)])
        out["fast_s"], out["fast_from"] = comm.clock - t0, int(got[0])
        t1 = slow.clock
        slow.exchange([(1 - slow.rank, payload)], [(1 - slow.rank, got)])
        out["slow_s"], out["slow_from"] = comm.clock - t1, int(got[0])
        out["same_clock"] = fast.clock == slow.clock == comm.clock
        return out

    result = simulate(4, rank, alpha=alpha, beta=beta, intra_alpha=intra_alpha, intra_beta=intra_beta)
    for r, out in enumerate(result.results):
        assert out["fast"] == (r % 2, 2) and out["slow"] == (r // 2, 2)
        assert out["fast_from"] == r ^ 1 and out["slow_from"] == r ^ 2
        assert out["fast_s"] == pytest.approx(intra_alpha + intra_beta * nbytes)
        assert out["slow_s"] == pytest.approx(alpha + beta * nbytes)
        assert out["same_clock"]
    assert result.time == pytest.approx(intra_alpha + intra_beta * nbytes + alpha + beta * nbytes)


def test_simcomm_split_of_a_split_and_an_abort_reaches_every_group():
    """A group split again maps its ranks through both levels; an error on one rank inside a
    call on one group aborts the world: a rank waiting on another group raises at once."""
    def rank(comm):
        pair = comm.split([[0, 1, 2], [3, 4, 5]])
        sub = pair.split([[2, 0], [1]])     # numbered by position: the pair's rank 2 is rank 0 here
        me = torch.tensor(comm.rank)
        return pair.allgather_small(me).tolist(), sub.allgather_small(me).tolist()

    results = simulate(6, rank).results
    for r, (pair, sub) in enumerate(results):
        assert pair == ([0, 1, 2] if r < 3 else [3, 4, 5])
        assert sub == {0: [2, 0], 2: [2, 0], 1: [1], 3: [5, 3], 5: [5, 3], 4: [4]}[r]

    def failing(comm):
        a = comm.split([[0, 1], [2, 3]], local=True)
        scope = a.new_scope("test")
        if comm.rank == 1:   # fails inside a call on its node's group, then leaves without a word
            try:
                with a.call_scope(scope):
                    raise RuntimeError("injected on rank 1")
            except RuntimeError:
                return None
        # ranks 0, 2, 3 wait on the world for rank 1, which never sends
        try:
            comm.allgather_small(torch.tensor(comm.rank))
        except CommAbortedError as exc:
            return str(exc)

    start = time.monotonic()
    errors = simulate(4, failing, timeout=30).results
    assert time.monotonic() - start < 10, "the waiting ranks were not released by the abort"
    for r in (0, 2, 3):
        assert "rank 1 failed: RuntimeError: injected on rank 1" in errors[r], errors


@pytest.mark.parametrize("groups, words", [
    ([[0, 1], [2]], "must hold each rank 0..3 exactly once"),
    ([[0, 1], [1, 2, 3]], "must hold each rank 0..3 exactly once"),
    ([[0, 1, 2, 3], []], "empty group"),
    ([[0, 1], [2, 3, 4]], "must hold each rank 0..3 exactly once"),
])
def test_split_refuses_groups_that_do_not_cut_the_world(groups, words):
    def rank(comm):
        try:
            comm.split(groups)
        except ValueError as exc:
            return str(exc)
    for text in simulate(4, rank).results:
        assert words in text


# -- gloo processes ------------------------------------------------------------------------
def _gloo_split(rank, world_size):
    from sparsecomm.comm.torch_comm import TorchComm
    import torch.distributed as dist

    comm = TorchComm(timeout=30)
    me = torch.tensor(rank)
    split = Topology.from_env({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": str(rank)}).split(comm)
    out = {"intra": split.intra.allgather_small(me).tolist(), "inter": split.inter.allgather_small(me).tolist(),
           "ranks": (split.intra.rank, split.inter.rank)}
    split.close()
    # a TorchComm over a group that is not the whole world: its groups are made by their members only
    sub_group = dist.new_group([1, 2, 3], use_local_synchronization=True) if rank else None
    if rank:
        sub = TorchComm(sub_group, timeout=30)
        part = sub.split([[0, 2], [1]])
        out["sub"] = part.allgather_small(me).tolist()
        part.close()
        sub.close()
    comm.close()
    return out


@pytest.mark.distributed
def test_torchcomm_split_over_gloo_processes():
    from sparsecomm.testing import spawn

    outs = spawn(_gloo_split, 4, timeout=120)
    intra, inter = _expected_groups(2, 2)
    for r, out in enumerate(outs):
        assert out["intra"] == intra[r // 2] and out["inter"] == inter[r % 2], (r, out)
        assert out["ranks"] == (r % 2, r // 2)
        if r:
            assert out["sub"] == ([1, 3] if r in (1, 3) else [2]), (r, out)


# -- mpirun ---------------------------------------------------------------------------------
MPIRUN = shutil.which("mpirun")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

_MPI_SPLIT = r'''
import json, os, sys
import torch
from mpi4py import MPI
from sparsecomm import Topology
from sparsecomm.comm.mpi_comm import MPIComm

rank = MPI.COMM_WORLD.Get_rank()
comm = MPIComm(timeout=30)
me = torch.tensor(rank)
split = Topology(2, 2).split(comm)
out = {"intra": split.intra.allgather_small(me).tolist(), "inter": split.inter.allgather_small(me).tolist(),
       "ranks": [split.intra.rank, split.inter.rank]}
try:
    Topology(2, 2, 0, 0).split(comm) if rank == 3 else Topology(2, 2).split(comm)
except ValueError as exc:
    out["clash"] = str(exc)
split.close()
comm.close()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
'''


@pytest.mark.mpi
@pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY, reason="needs mpirun on PATH and mpi4py")
def test_mpicomm_split_under_mpirun(tmp_path):
    script = tmp_path / "split.py"
    script.write_text(_MPI_SPLIT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root)
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4", sys.executable, str(script), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    intra, inter = _expected_groups(2, 2)
    clashes = set()
    for r in range(4):
        with open(tmp_path / f"rank{r}.json") as f:
            out = json.load(f)
        assert out["intra"] == intra[r // 2] and out["inter"] == inter[r % 2], (r, out)
        assert out["ranks"] == [r % 2, r // 2]
        clashes.add(out.get("clash"))
    assert clashes == {"ranks 0 and 3 both say they are local rank 0 of node 0: check LOCAL_RANK and GROUP_RANK "
                       "(or the Topology given)"}

