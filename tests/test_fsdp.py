"""The FSDP2 all-reduce hook on real fully_shard models over n nodes x L gloo ranks.

Each rank trains a small MLP whose Linear layers and root are ``fully_shard``-ed. The
reference for ``dense`` through the hook is native HSDP, ``fully_shard`` on a 2-D
``(replicate, shard)`` mesh built here with ``init_device_mesh``: the sharded gradients and
parameters must be bit-identical. For a sparse algorithm a recording wrapper captures each
hooked module's reduce-scatter output ``g`` before the hook and the averaged shard ``out``
after it; with the shard's residual before (``e``) and after (``e'``), summed over the n ranks
that hold the shard (one per node) with plain float64 math:

    sum_nodes (g + e) == n * out + sum_nodes e'        (conservation)
"""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.testing import spawn

pytestmark = pytest.mark.distributed

LR = 0.2
TOPKA_STEPS = 24


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 15), nn.ReLU(), nn.Linear(15, 4))


def _sharded(mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for sub in model:
        if isinstance(sub, nn.Linear):
            fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(4321)
    teacher = torch.randn(12, 4, generator=gen)
    gen.manual_seed(1000 * step + rank)
    x = torch.randn(32, 12, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def _step(model, optimizer, rank: int, step: int) -> float:
    x, y = _batch(rank, step)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _local(model) -> list[torch.Tensor]:
    return [p.detach().to_local().clone() for p in model.parameters()]


def _local_grads(model) -> list[torch.Tensor]:
    return [p.grad.to_local().clone() for p in model.parameters()]


def _plain(value):
    """Tensors as numpy arrays (they travel back to the test by value, not as shared memory)."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _tensors(value):
    """The inverse of _plain."""
    if hasattr(value, "__array__") and not isinstance(value, torch.Tensor):
        return torch.from_numpy(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    return value


def _record(state: sc.FSDPHookState, log: list) -> None:
    """Wrap the state's per-module reduction: log (module, g, e, out, e') of every call."""
    inner = state._reduce

    def recording(label, group, output):
        before = state.local_state_dict()["reducers"][label]["residual"]
        g = output.detach().double().clone()
        inner(label, group, output)
        after = state.local_state_dict()["reducers"][label]["residual"]
        zero = torch.zeros_like(g)
        log.append((label, g, zero if before is None else before.double().reshape(-1),
                    output.detach().double().clone(), zero if after is None else after.double().reshape(-1)))
    state._reduce = recording


def _dense_and_sparse_worker(rank: int, world_size: int, nodes: int, per_node: int, steps: int):
    from torch.distributed.device_mesh import init_device_mesh

    topology = sc.Topology(nodes, per_node)
    mesh2d = init_device_mesh("cpu", (nodes, per_node), mesh_dim_names=("replicate", "shard"))
    out = {}
    # native HSDP, the reference
    hsdp = _sharded(mesh2d)
    opt = torch.optim.SGD(hsdp.parameters(), lr=LR)
    for step in range(steps):
        _step(hsdp, opt, rank, step)
    out["hsdp"] = (_local(hsdp), _local_grads(hsdp))
    # dense through the hook on the node's 1-D mesh
    model = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("dense", 1.0, nodes=topology)
    sc.fsdp.register_hook(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        _step(model, opt, rank, step)
    out["hook"] = (_local(model), _local_grads(model))
    # a sparse algorithm: trains and conserves
    model = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 0.1, nodes=topology)
    sc.fsdp.register_hook(model, state)
    log: list = []
    _record(state, log)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out["losses"] = [_step(model, opt, rank, step % 4) for step in range(TOPKA_STEPS)]
    out["log"] = log
    out["place"] = divmod(rank, per_node)
    state.close()
    return _plain(out)


def _check_conservation(results, nodes: int) -> None:
    by_local: dict[int, list] = {}
    for res in results:
        by_local.setdefault(res["place"][1], []).append(res["log"])
    for local, logs in by_local.items():
        assert len(logs) == nodes
        assert len({len(log) for log in logs}) == 1
        for calls in zip(*logs):
            assert len({c[0] for c in calls}) == 1, "the ranks of one shard ran different modules in one call"
            lhs = sum(g + e for _, g, e, _, _ in calls)
            rhs = nodes * calls[0][3] + sum(e2 for *_, e2 in calls)
            scale = max(1.0, float(lhs.abs().max()))
            assert float((lhs - rhs).abs().max()) / scale < 1e-5, f"conservation broken on shard {local}"
            for c in calls[1:]:
                assert torch.equal(c[3], calls[0][3]), "the ranks of one shard disagree on its average"
    assert any(float(e2.abs().sum()) > 0 for log in by_local[0] for *_, e2 in log), "topka kept no residual"


@pytest.mark.parametrize("nodes,per_node", [(1, 2), (2, 1), (2, 2), pytest.param(3, 2, marks=pytest.mark.slow)])
def test_dense_hook_is_hsdp_and_topka_trains_and_conserves(nodes, per_node):
    results = _tensors(spawn(_dense_and_sparse_worker, nodes * per_node, nodes, per_node, 2, timeout=120))
    for rank, res in enumerate(results):
        for a, b in zip(res["hsdp"][0] + res["hsdp"][1], res["hook"][0] + res["hook"][1]):
            assert torch.equal(a, b), f"rank {rank}: dense through the hook differs from native HSDP"
        losses = res["losses"]
        assert all(math.isfinite(v) for v in losses), losses
        assert sum(losses[-4:]) < 0.9 * sum(losses[:4]), f"rank {rank}: loss did not fall: {losses}"
    if nodes > 1:
        _check_conservation(results, nodes)


# -- exact resume -----------------------------------------------------------------------------
RESUME_STEPS, RESUME_AT = 6, 3


def _resume_worker(rank: int, world_size: int, saved=None):
    topology = sc.Topology(2, 2)
    model = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 0.1, nodes=topology)
    if saved is None:
        sc.fsdp.register_hook(model, state)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        checkpoint = None
        for step in range(RESUME_STEPS):
            if step == RESUME_AT:
                checkpoint = (_local(model), state.state_dict())
            _step(model, opt, rank, step)
        return _plain((_local(model), checkpoint))
    params, hook_state = _tensors(saved[rank])
    # another rank's state, or another configuration's, is refused before anything changes
    with pytest.raises(ValueError, match=f"holds the state of rank {(rank + 1) % world_size}"):
        sc.FSDPHookState("topka", 0.1, nodes=topology).load_state_dict(saved[(rank + 1) % world_size][1])
    with pytest.raises(ValueError, match="density"):
        sc.FSDPHookState("topka", 0.2, nodes=topology).load_state_dict(hook_state)
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.to_local().copy_(value)
    if rank % 2:  # both orders: loaded before registration, and after it
        state.load_state_dict(hook_state)
        sc.fsdp.register_hook(model, state)
    else:
        sc.fsdp.register_hook(model, state)
        state.load_state_dict(hook_state)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(RESUME_AT, RESUME_STEPS):
        _step(model, opt, rank, step)
    # only rank 0 resumes, the others start fresh: the same error on every rank, at once
    mixed = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 0.1, nodes=topology)
    if rank == 0:
        state.load_state_dict(hook_state)
    sc.fsdp.register_hook(mixed, state)
    said = r"different checkpoints \(ranks \[0\]: save 0x[0-9a-f]+; ranks \[1, 2, 3\]: fresh"
    with pytest.raises(ValueError, match=said):
        _step(mixed, torch.optim.SGD(mixed.parameters(), lr=0.5), rank, RESUME_AT)
    return _plain((_local(model), None))


def test_resume_in_fresh_processes_is_bit_exact():
    first = _tensors(spawn(_resume_worker, 4, timeout=120))
    saved = [checkpoint for _, checkpoint in first]
    assert all(saved), "no checkpoint was taken"
    resumed = _tensors(spawn(_resume_worker, 4, _plain(saved), timeout=120))
    for rank, ((straight, _), (again, _)) in enumerate(zip(first, resumed)):
        for a, b in zip(straight, again):
            assert torch.equal(a, b), f"rank {rank}: the resumed run drifted from the uninterrupted one"


# -- non-finite gradients ------------------------------------------------------------------
def _nonfinite_worker(rank: int, world_size: int):
    from torch.distributed.device_mesh import init_device_mesh

    topology = sc.Topology(2, 2)
    x, y = _batch(rank, 0)
    if rank == 1:
        x[3, 5] = float("inf")  # a non-finite gradient in every layer on one rank of one node

    def backward(model):
        nn.functional.cross_entropy(model(x), y).backward()
        return _local_grads(model)

    out = {"hsdp": backward(_sharded(init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))))}
    model = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 0.1, nodes=topology)
    sc.fsdp.register_hook(model, state)
    out["propagate"] = backward(model)
    out["residuals"] = [s["residual"] for s in state.local_state_dict()["reducers"].values()]
    model = _sharded(sc.fsdp.node_mesh(topology))
    sc.fsdp.register_hook(model, sc.FSDPHookState("topka", 0.1, nodes=topology, nonfinite="raise"))
    try:
        backward(model)
        out["raise"] = None
    except ValueError as exc:
        out["raise"] = str(exc)
    return _plain(out)


def test_nonfinite_propagates_like_hsdp_and_raises_on_every_rank():
    results = _tensors(spawn(_nonfinite_worker, 4, timeout=120))
    for rank, res in enumerate(results):
        assert any(not bool(torch.isfinite(g).all()) for g in res["hsdp"]), "the reference saw no non-finite value"
        for a, b in zip(res["hsdp"], res["propagate"]):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf()), \
                f"rank {rank}: non-finite values not where dense HSDP puts them"
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), f"rank {rank}: finite values differ from HSDP"
        assert all(r is None or not bool(r.any()) for r in res["residuals"]), "a non-finite step changed a residual"
        # rank 1's inf reaches both shards of node 0 in the reduce-scatter; node 1's shards are
        # finite, yet its ranks raise the same error, naming the world's ranks
        assert res["raise"] is not None and res["raise"].startswith("non-finite gradient on ranks [0, 1] "), \
            f"rank {rank} did not raise the agreed error: {res['raise']!r}"
        assert res["raise"] == results[0]["raise"], "the ranks raised different errors"


# -- failing together -----------------------------------------------------------------------
LINGER_S = 4.0


class _FailingReducer:
    """A reducer that fails at its ``fail_at``-th call, inside the hook: raises, or (``kill_mark``
    set) writes the time to that file and SIGKILLs its own process."""

    def __init__(self, inner, fail_at: int, kill_mark: str | None = None):
        self.inner, self.fail_at, self.calls, self.kill_mark = inner, fail_at, 0, kill_mark
        self.last_stats = {}

    def __call__(self, grad, out=None):
        self.calls += 1
        if self.calls == self.fail_at and self.kill_mark is not None:
            with open(self.kill_mark, "w") as f:
                f.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGKILL)
        if self.calls == self.fail_at:
            raise RuntimeError("injected failure in the hook")
        result = self.inner(grad, out=out)
        self.last_stats = self.inner.last_stats
        return result

    def state_dict(self):
        return self.inner.state_dict()


def _failing_worker(rank: int, world_size: int, kill_mark: str | None = None):
    topology = sc.Topology(2, 2)
    model = _sharded(sc.fsdp.node_mesh(topology))
    state = sc.FSDPHookState("topka", 0.1, nodes=topology)
    sc.fsdp.register_hook(model, state)
    if rank == 1:  # the last Linear's reducer fails at its second call (the first module of step 1)
        name = sorted(state._reducers)[-1]
        state._reducers[name] = _FailingReducer(state._reducers[name], fail_at=2, kill_mark=kill_mark)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    try:
        for step in range(4):
            _step(model, opt, rank, step)
    except Exception as exc:  # noqa: BLE001 - the test reports what each rank raised
        raised = time.monotonic()
        if rank == 1:
            # a failed rank that lingers (logging, saving) before it exits: its peers must not
            # need its exit (the connection closing) to learn of the failure
            time.sleep(LINGER_S)
        return type(exc).__name__, str(exc)[:300], raised
    return None, None, time.monotonic()


def test_one_rank_raising_in_the_hook_makes_every_rank_raise():
    results = spawn(_failing_worker, 4, timeout=90)  # the process group's timeout is 90 s
    for rank, (kind, message, _) in enumerate(results):
        assert kind is not None, f"rank {rank} finished training although rank 1 failed"
    assert results[1][:2] == ("RuntimeError", "injected failure in the hook")
    failed_at = results[1][2]
    late = {rank: t - failed_at for rank, (_, _, t) in enumerate(results)}
    # rank 3 shares rank 1's shard: it waits in the hook's Comm and hears of the failure there,
    # with its cause, before rank 1 exits
    assert results[3][0] in ("CommAbortedError", "CommError"), results[3]
    if results[3][0] == "CommAbortedError":  # the cause arrived (else only the closed connection)
        assert "injected failure" in results[3][1], results[3]
    assert late[3] < LINGER_S - 1, f"rank 3 learnt of the failure only when rank 1 exited: {late}"
    # ranks 0 and 2 wait in FSDP's own reduce-scatter: its backend tells them when the failed
    # ranks exit
    assert max(late.values()) < LINGER_S + 15, f"seconds after rank 1 failed until each rank raised: {late}"


def test_one_rank_killed_in_the_hook_makes_every_rank_raise(tmp_path):
    mark = str(tmp_path / "killed_at")
    results = spawn(_failing_worker, 4, mark, timeout=90, may_die=(1,))
    killed_at = float(open(mark).read())
    for rank in (0, 2, 3):
        kind, message, raised = results[rank]
        assert kind is not None, f"rank {rank} finished training although rank 1 was killed"
        assert raised - killed_at < 10, f"rank {rank} raised {raised - killed_at:.1f} s after rank 1 was killed"
    assert results[3][0] in ("CommAbortedError", "CommError"), results[3]


def test_hook_refusals_and_fsdp_variants_bfloat16_resharding_accumulation():
    with pytest.raises(ValueError, match="density"):
        sc.FSDPHookState("topka", 0.0)
    with pytest.raises(ValueError, match="nonfinite"):
        sc.FSDPHookState("topka", 0.1, nonfinite="ignore")
    spawn(_refusal_worker, 2, timeout=60)


def _refusal_worker(rank: int, world_size: int):
    from torch.distributed.device_mesh import init_device_mesh

    with pytest.raises(ValueError, match="fully_shard"):
        sc.fsdp.register_hook(_model(), sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
    hsdp = _sharded(init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard")))
    with pytest.raises(ValueError, match="native HSDP"):
        sc.fsdp.register_hook(hsdp, sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
    flat = _sharded(init_device_mesh("cpu", (2,)))
    with pytest.raises(ValueError, match="sharded over ranks"):
        sc.fsdp.register_hook(flat, sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
    # bfloat16 reduce dtype: reduced in float32, rounded once; HSDP rounds its sum first
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    x, y = _batch(rank, 0)

    def bf16_grads(mesh, hooked: bool):
        model = _model()
        for sub in model:
            if isinstance(sub, nn.Linear):
                fully_shard(sub, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if hooked:
            sc.fsdp.register_hook(model, sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
        nn.functional.cross_entropy(model(x).float(), y).backward()
        return _local_grads(model)

    hsdp_mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    reference = bf16_grads(hsdp_mesh, False)
    hooked = bf16_grads(sc.fsdp.node_mesh(sc.Topology(2, 1)), True)
    for a, b in zip(reference, hooked):
        assert torch.allclose(a, b, rtol=2 ** -7, atol=1e-6), (a - b).abs().max()
    # no resharding after forward, and two micro-batches with the first's sync off: the hook
    # runs once, on the accumulated gradient, as HSDP's allreduce does
    def accumulated_grads(mesh, hooked: bool):
        model = _model()
        for sub in model:
            if isinstance(sub, nn.Linear):
                fully_shard(sub, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
        if hooked:
            sc.fsdp.register_hook(model, sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
        for micro in range(2):
            model.set_requires_gradient_sync(micro == 1)
            xm, ym = _batch(rank, 1 + micro)
            nn.functional.cross_entropy(model(xm), ym).backward()
        return _local_grads(model)

    for a, b in zip(accumulated_grads(hsdp_mesh, False), accumulated_grads(sc.fsdp.node_mesh(sc.Topology(2, 1)), True)):
        assert torch.equal(a, b), "accumulated gradients differ from HSDP's"
    # float64 gradients: refused on every rank, naming the setting to change
    model = _sharded(sc.fsdp.node_mesh(sc.Topology(2, 1))).double()
    sc.fsdp.register_hook(model, sc.FSDPHookState("dense", 1.0, nodes=sc.Topology(2, 1)))
    with pytest.raises(ValueError, match="reduce_dtype=torch.float32"):
        nn.functional.cross_entropy(model(x.double()), y).backward()
