"""Momentum correction through the DDP and FSDP2 hooks, with real gloo processes: at density 1
the hook's momentum with SGD(momentum=0) trains as DDP's own allreduce with SGD(momentum=m)
(masking: as plain SGD), flat and two-level; a checkpoint resumes exactly in fresh processes;
the options are compared on load. The references are torch's own DDP and SGD."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.testing import spawn

STEPS = 6
M = 0.9
LR = 0.05


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)


def _train(rank, world_size, mode, hierarchy, steps=STEPS, save=None, load=None, start=0):
    """``mode``: "dense" (DDP's allreduce, SGD with momentum), "hook" (the hook's momentum, SGD
    without), "masked" (the hook with masking), "plain" (DDP's allreduce, SGD without momentum),
    "policy" (the hook's momentum with the biases dense by a policy: their velocity too)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), bucket_cap_mb=0.001)
    state = None
    if mode in ("hook", "masked", "policy"):
        nodes = sc.Topology(2, world_size // 2) if hierarchy == "node" else None
        policy = sc.Policy(dense_1d=True, dense_below=0) if mode == "policy" else None
        state = sc.DDPHookState("topka", 1.0 if save is None and load is None else 0.1, hierarchy=hierarchy,
                                nodes=nodes, momentum=M, momentum_masking=mode == "masked", nesterov=False,
                                policy=policy)
        model.register_comm_hook(state, sc.ddp_hook)
    momentum = M if mode == "dense" else 0.0
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    if load is not None:
        saved = torch.load(load.format(rank=rank), weights_only=False)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["hook"])
    for step in range(start, steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if save is not None and step + 1 == 3:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()},
                       save.format(rank=rank))
    if state is not None:
        state.close()
    # numpy: a tensor would reach the parent as a shared-memory handle that dies with this process
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.distributed
@pytest.mark.parametrize("hierarchy,ranks", [("flat", 2), ("node", 4)])
def test_the_hooks_momentum_at_density_one_is_ddp_with_momentum_sgd(hierarchy, ranks):
    dense = spawn(_train, ranks, "dense", "flat", timeout=300)
    hook = spawn(_train, ranks, "hook", hierarchy, timeout=300)
    plain = spawn(_train, ranks, "plain", "flat", timeout=300)
    masked = spawn(_train, ranks, "masked", hierarchy, timeout=300)
    policy = spawn(_train, ranks, "policy", hierarchy, timeout=300)
    dense, hook, plain, masked, policy = ([torch.from_numpy(p) for p in run]
                                         for run in (dense, hook, plain, masked, policy))
    for rank in range(ranks):
        torch.testing.assert_close(hook[rank], dense[rank], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(policy[rank], dense[rank], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(masked[rank], plain[rank], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(dense[0], plain[0], atol=1e-4)   # momentum made a difference


@pytest.mark.distributed
@pytest.mark.parametrize("hierarchy,ranks", [("flat", 2), ("node", 4)])
def test_a_checkpoint_with_velocities_resumes_exactly_in_fresh_processes(tmp_path, hierarchy, ranks):
    path = str(tmp_path / "ckpt{rank}.pt")
    first = spawn(_train, ranks, "hook", hierarchy, STEPS, path, timeout=300)
    saved = torch.load(path.format(rank=0), weights_only=False)["hook"]
    assert saved["sparsecomm"] == "DDPHookState"
    resumed = spawn(_train, ranks, "hook", hierarchy, STEPS, None, path, 3, timeout=300)
    for rank in range(ranks):
        assert (first[rank] == resumed[rank]).all(), f"rank {rank} drifted after resume"


def _load_with_other_momentum(rank, world_size, path):
    state = sc.DDPHookState("topka", 0.1, momentum=0.8)
    try:
        state.load_state_dict(torch.load(path.format(rank=rank), weights_only=False)["hook"])
    except ValueError as exc:
        return str(exc)
    finally:
        state.close()
    return None


@pytest.mark.distributed
def test_a_checkpoint_is_refused_by_a_state_with_another_momentum(tmp_path):
    path = str(tmp_path / "ckpt{rank}.pt")
    spawn(_train, 2, "hook", "flat", STEPS, path, timeout=300)
    for msg in spawn(_load_with_other_momentum, 2, path, timeout=120):
        assert msg is not None and "local update" in msg and "'momentum': 0.9" in msg and "'momentum': 0.8" in msg


def test_warmup_steps_with_momentum_is_refused_saying_what_to_use():
    with pytest.raises(ValueError, match="density_schedule"):
        sc.DDPHookState("topka", 0.1, warmup_steps=2, momentum=0.9)
    with pytest.raises(ValueError, match="momentum must be a number"):
        sc.FSDPHookState("topka", 0.1, momentum=-0.1)


def _fsdp_worker(rank, world_size, nodes, per_node, steps):
    """Native HSDP with SGD(momentum=m) against the FSDP2 hook (topka at density 1) with the
    hook's momentum and SGD(momentum=0): the local shards of the parameters after ``steps``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def sharded(mesh):
        model = _model()
        for sub in model:
            if isinstance(sub, nn.Linear):
                fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def train(model, momentum):
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
        for step in range(steps):
            x, y = _batch(rank, step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return [p.detach().to_local().clone().numpy() for p in model.parameters()]

    topology = sc.Topology(nodes, per_node)
    hsdp = train(sharded(init_device_mesh("cpu", (nodes, per_node), mesh_dim_names=("replicate", "shard"))), M)
    model = sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 1.0, nodes=topology, momentum=M)
    sc.fsdp.register_hook(model, state)
    hook = train(model, 0.0)
    state.close()
    # biases dense by a policy: their part keeps its velocity too
    model = sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 1.0, nodes=topology, momentum=M, policy=sc.Policy(dense_below=0))
    sc.fsdp.register_hook(model, state)
    with_policy = train(model, 0.0)
    state.close()
    return hsdp, hook, with_policy


@pytest.mark.distributed
@pytest.mark.parametrize("nodes,per_node", [(2, 1), (2, 2)])
def test_the_fsdp_hooks_momentum_at_density_one_is_hsdp_with_momentum_sgd(nodes, per_node):
    runs = spawn(_fsdp_worker, nodes * per_node, nodes, per_node, STEPS, timeout=300)
    for rank, (hsdp, hook, with_policy) in enumerate(runs):
        for a, b, c in zip(hsdp, hook, with_policy):
            torch.testing.assert_close(torch.from_numpy(b), torch.from_numpy(a), rtol=1e-5, atol=1e-6,
                                       msg=f"rank {rank}")
            torch.testing.assert_close(torch.from_numpy(c), torch.from_numpy(a), rtol=1e-5, atol=1e-6,
                                       msg=f"rank {rank}, with a policy")
