"""The DDP hook in two-level mode (``DDPHookState(hierarchy="node")``) with real gloo ranks.

Each test's reference is written here: plain DDP's own allreduce for the dense case, an
uninterrupted run for exact resume, sums over ranks for conservation.
"""

from __future__ import annotations

import io

import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

STEPS = 4


def _net():
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(24, 96), nn.Linear(96, 64), nn.Linear(64, 6)
            self.unused = nn.Linear(8, 8)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    torch.manual_seed(0)
    return Net()


def _build(algorithm, nodes, per_node, hook=True, hierarchy="node"):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_net(), bucket_cap_mb=0.01, find_unused_parameters=True)
    state = None
    if hook:
        density = 1.0 if algorithm == "dense" else 0.05
        state = sc.DDPHookState(algorithm, density, hierarchy=hierarchy, nodes=sc.Topology(nodes, per_node))
        model.register_comm_hook(state, sc.ddp_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, state, optimizer


def _step(model, optimizer, rank, step):
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(16, 24, generator=gen), torch.randint(0, 6, (16,), generator=gen)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _params(model) -> bytes:
    return _saved([p.detach().clone() for p in model.module.parameters()])


def _train(rank, world_size, nodes, per_node, algorithms, save_at):
    out = {}
    for algorithm in algorithms:
        model, state, optimizer = _build(algorithm, nodes, per_node)
        saves = {}
        for step in range(STEPS):
            _step(model, optimizer, rank, step)
            if step + 1 in save_at:
                saves[step + 1] = _saved({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                          "hook": state.state_dict()})
        out[algorithm] = (_params(model), saves, state.last_stats[0])
        state.close()
    return out


def _resume(rank, world_size, nodes, per_node, algorithms, saves):
    out = {}
    for algorithm in algorithms:
        for t, blob in saves[rank][algorithm].items():
            model, state, optimizer = _build(algorithm, nodes, per_node)
            saved = torch.load(io.BytesIO(blob))
            model.module.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            state.load_state_dict(saved["hook"])
            for step in range(t, STEPS):
                _step(model, optimizer, rank, step)
            out[(algorithm, t)] = _params(model)
            state.close()
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("nodes, per_node", [(2, 2), (2, 3)])
def test_two_level_hook_resumes_bit_exactly_in_fresh_processes(nodes, per_node):
    """Checkpoints after step 1 (DDP's initial buckets only) and 3 (its rebuilt ones), each
    rank's own, loaded in fresh processes: the parameters equal the uninterrupted run's."""
    algorithms = ["topka", "spardl", "oktopk"]
    world_size = nodes * per_node
    first = spawn(_train, world_size, nodes, per_node, algorithms, (1, 3), timeout=300)
    for algorithm in algorithms:
        stats = first[0][algorithm][2]
        assert stats["hierarchy"] == "node" and stats["inter_bytes_sent"] > 0, stats
    saves = [{a: first[r][a][1] for a in algorithms} for r in range(world_size)]
    second = spawn(_resume, world_size, nodes, per_node, algorithms, saves, timeout=300)
    for rank in range(world_size):
        for algorithm in algorithms:
            ref = torch.load(io.BytesIO(first[rank][algorithm][0]))
            for t in (1, 3):
                got = torch.load(io.BytesIO(second[rank][(algorithm, t)]))
                assert all(torch.equal(a, b) for a, b in zip(ref, got)), (rank, algorithm, t)


def _dense_against_ddp(rank, world_size, nodes, per_node):
    hooked, _, opt_h = _build("dense", nodes, per_node)
    plain, _, opt_p = _build("dense", nodes, per_node, hook=False)
    for step in range(3):
        _step(hooked, opt_h, rank, step)
        _step(plain, opt_p, rank, step)
    return _params(hooked), _params(plain)


@pytest.mark.distributed
def test_two_level_dense_hook_averages_like_ddp():
    """``dense`` two-level (reduce-scatter in the node, allreduce between nodes, all-gather) gives
    DDP's own average to float rounding, on every rank the same parameters."""
    results = spawn(_dense_against_ddp, 4, 2, 2, timeout=120)
    first = torch.load(io.BytesIO(results[0][0]))
    for hooked, plain in results:
        hooked, plain = torch.load(io.BytesIO(hooked)), torch.load(io.BytesIO(plain))
        for a, b, c in zip(hooked, plain, first):
            assert torch.equal(a, c)        # bit-identical across ranks
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_flat_checkpoint_is_refused_by_a_two_level_hook_and_back():
    flat = sc.DDPHookState("topka", 0.05)
    node = sc.DDPHookState("topka", 0.05, hierarchy="node", nodes=sc.Topology(2, 2))
    with pytest.raises(ValueError, match="hierarchy 'flat'.*'node, 2 nodes x 2 ranks'"):
        node.load_state_dict(flat.local_state_dict())
    with pytest.raises(ValueError, match="hierarchy 'node, 2 nodes x 2 ranks'.*'flat'"):
        flat.load_state_dict(node.local_state_dict())
    other = sc.DDPHookState("topka", 0.05, hierarchy="node", nodes=sc.Topology(1, 4))
    with pytest.raises(ValueError, match="1 nodes x 4 ranks"):
        other.load_state_dict(node.local_state_dict())


def test_hook_reads_the_topology_from_torchruns_variables(monkeypatch):
    for name, value in {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    state = sc.DDPHookState("topka", 0.05, hierarchy="node")
    assert state.topology == sc.Topology(2, 3, node=1, local_rank=1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        sc.DDPHookState("topka", 0.05, hierarchy="node")
    with pytest.raises(ValueError, match="hierarchy must be one of"):
        sc.DDPHookState("topka", 0.05, hierarchy="nodes")


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (3, 2), (2, 3)])
def test_a_residual_outside_the_shard_reaches_its_owner(nodes, per_node):
    """A loaded residual holds values outside this rank's shard (the DDP hook's buckets moved
    between save and resume): nothing of it is lost. Over all ranks, gradients plus loaded
    residuals equal the result plus the residuals after the call, exactly (integer values)."""
    n, size = 101, nodes * per_node

    def run(comm):
        reducer = sc.SparseAllreduce("topka", 0.1, comm, hierarchy="node", nodes=sc.Topology(nodes, per_node))
        gen = torch.Generator().manual_seed(comm.rank)
        loaded = torch.randint(-4, 5, (n,), generator=gen).float()   # values in every position
        grad = torch.randint(-4, 5, (n,), generator=gen).float()
        reducer.load_state_dict({"checkpoint_version": reducer.state_dict()["checkpoint_version"],
                                 "algorithm": "topka", "density": 0.1, "rank": comm.rank, "world_size": size,
                                 "hierarchy": f"node, {nodes} nodes x {per_node} ranks", "fingerprint": 7,
                                 "residual": loaded, "algorithm_state": {}, "calls": 0})
        out = reducer(grad)
        return grad, loaded, out, reducer.residual.clone()

    results = simulate(size, run).results
    before = sum(g + e for g, e, _, _ in results)
    after = results[0][2] + sum(r for _, _, _, r in results)
    assert torch.equal(before, after)
    assert all(torch.equal(results[0][2], out) for _, _, out, _ in results)


def test_options_that_depend_on_the_ranks_are_checked_against_the_nodes():
    """Two-level spardl runs among one rank per node: its teams must divide the nodes, not P."""
    sc.DDPHookState("spardl", 0.05, hierarchy="node", nodes=sc.Topology(2, 3), teams=2)
    with pytest.raises(ValueError, match="teams"):
        sc.DDPHookState("spardl", 0.05, hierarchy="node", nodes=sc.Topology(2, 3), teams=3)


def _auto_hierarchy(rank, world_size):
    model, state, optimizer = _build("topka", 2, 2, hierarchy="auto")
    for step in range(3):
        _step(model, optimizer, rank, step)
    choices = sorted({str(stats.get("hierarchy", "flat")) for stats in state.last_stats.values()})
    params = _params(model)
    saved = state.local_state_dict()
    state.close()
    return params, choices, saved["hierarchy"]


@pytest.mark.distributed
def test_the_hook_with_hierarchy_auto_decides_the_same_everywhere():
    """hierarchy="auto" through the hook: each bucket's reducer decides flat or two-level on
    the measured links; every rank ends with the same parameters, the checkpoint says auto."""
    results = spawn(_auto_hierarchy, 4, timeout=180)
    first = torch.load(io.BytesIO(results[0][0]))
    for params, choices, saved in results:
        assert all(torch.equal(a, b) for a, b in zip(torch.load(io.BytesIO(params)), first))
        assert choices == results[0][1] and set(choices) <= {"flat", "node"}, choices
        assert saved == "auto"
