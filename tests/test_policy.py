"""The per-parameter policy of the hooks (dense, the state's algorithm, or another treatment by
name, module type or size), matched here against rules and through DDP on gloo processes.

The references are written here: which parameter each rule should pick, the dense average of
every rank's gradient, and top-k's sum at the k of each treatment's group (``ceil(density n)`` of
the group's own length, its parameters concatenated in bucket order).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.testing import spawn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(40, 96)       # 3840 weights: below the default size threshold
        self.norm = nn.LayerNorm(96)
        self.body = nn.Linear(96, 80)        # 7680: compressed by default
        self.head = nn.Linear(80, 60)        # 4800
        self.out = nn.Linear(60, 5)          # 300

    def forward(self, x):
        x = torch.relu(self.norm(self.embed(x)))
        return self.out(torch.relu(self.head(torch.relu(self.body(x)))))


def _treatments(policy: sc.Policy, model: nn.Module) -> dict[str, str]:
    state = sc.DDPHookState("topka", 0.01, policy=policy)
    state.bind(model)
    return {name: state.treatment_key(p) for name, p in model.named_parameters()}


def test_the_default_policy_leaves_small_and_one_dimensional_parameters_dense():
    got = _treatments(sc.Policy(), Net())
    want = {name: ("default" if name in ("body.weight", "head.weight") else "dense")
            for name, _ in Net().named_parameters()}
    assert got == want


def test_rules_match_by_name_module_size_and_dimensions_first_match_wins():
    policy = sc.Policy([
        sc.Rule(sc.Treatment("spardl", density=0.1), name="head.*"),     # head.weight and head.bias
        sc.Rule("dense", name="body.weight"),
        sc.Rule(sc.Treatment(density=0.5), module=nn.LayerNorm),
        sc.Rule("default", below=400, max_ndim=2),      # the small rest: before dense_1d, so biases too
    ], dense_1d=True, dense_below=0)
    got = _treatments(policy, Net())
    assert got == {"embed.weight": "default", "embed.bias": "default", "norm.weight": "density=0.5",
                   "norm.bias": "density=0.5", "body.weight": "dense", "body.bias": "default",
                   "head.weight": "spardl density=0.1", "head.bias": "spardl density=0.1",
                   "out.weight": "default", "out.bias": "default"}


def test_module_rules_match_subclasses_and_names_skip_the_wrappers():
    class MyNorm(nn.LayerNorm):
        pass

    class _LightningModuleWrapperBase(nn.Module):   # Lightning's wrapper, by its type's name
        def __init__(self, inner):
            super().__init__()
            self._forward_module = inner

    model = nn.Sequential(nn.Linear(4, 8), MyNorm(8))
    model.module = nn.Linear(2, 2)        # a submodule the user named "module" keeps its name
    wrapped = torch.compile(_LightningModuleWrapperBase(model))
    got = _treatments(sc.Policy([sc.Rule("dense", module=nn.LayerNorm), sc.Rule("dense", name="0.weight"),
                                 sc.Rule("dense", name="module.bias")], dense_1d=False, dense_below=0), wrapped)
    assert got == {"_orig_mod._forward_module.0.weight": "dense", "_orig_mod._forward_module.0.bias": "default",
                   "_orig_mod._forward_module.1.weight": "dense", "_orig_mod._forward_module.1.bias": "dense",
                   "_orig_mod._forward_module.module.weight": "default",
                   "_orig_mod._forward_module.module.bias": "dense"}


def test_a_policy_is_a_value_that_survives_its_saved_form():
    policy = sc.Policy([sc.Rule(sc.Treatment("spardl", density=0.1, teams=2), name="a.*", module=nn.Embedding),
                        sc.Rule("dense", below=10)], dense_1d=False, dense_below=128)
    again = sc.hooks.policy.Policy.from_state(policy.to_state())
    assert again == policy and again.text() == policy.text()
    assert sc.Policy() != policy and sc.Policy() == sc.Policy()
    assert "teams=2" in policy.text() and "torch.nn.modules.sparse.Embedding" in policy.text()


@pytest.mark.parametrize("bad, match", [
    (lambda: sc.Rule("sparse"), "'dense', 'default'"),
    (lambda: sc.Rule("dense", below=-1), "below"),
    (lambda: sc.Rule("dense", module=3), "module class"),
    (lambda: sc.Treatment("nosuch"), "nosuch"),
    (lambda: sc.Treatment("topka", density=2.0), "density"),
    (lambda: sc.Policy(["dense"]), "Rule objects"),
    (lambda: sc.DDPHookState("topka", 0.01, policy="everything"), "policy must be"),
    (lambda: sc.DDPHookState("topka", 0.01, policy=sc.Policy([sc.Rule(sc.Treatment("spardl", teams=0))]))
     , "team"),
])
def test_bad_policies_say_what_is_accepted(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_a_checkpoint_is_refused_by_a_state_with_another_policy():
    saved = sc.DDPHookState("topka", 0.01, policy="default").local_state_dict()
    with pytest.raises(ValueError, match="policy"):
        sc.DDPHookState("topka", 0.01).load_state_dict(saved)
    with pytest.raises(ValueError, match="policy"):
        sc.DDPHookState("topka", 0.01, policy=sc.Policy(dense_below=10)).load_state_dict(saved)
    sc.DDPHookState("topka", 0.01, policy=sc.Policy()).load_state_dict(saved)
    assert "policy" not in sc.DDPHookState("topka", 0.01).local_state_dict()


# -- through DDP ----------------------------------------------------------------------------------

POLICY = sc.Policy([sc.Rule(sc.Treatment(density=0.2), name="head.*"), sc.Rule("dense", module=nn.LayerNorm)])
STEPS = 3
DENSITY = 0.02


def _data(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(16, 40, generator=g), torch.randint(0, 5, (16,), generator=g)


def _mixed(rank, world_size, bucket_cap_mb):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = Net()
    local = Net()
    local.load_state_dict(net.state_dict())
    model = DDP(net, bucket_cap_mb=bucket_cap_mb)
    state = sc.register(model, sc.DDPHookState("topka", DENSITY, policy=POLICY))
    names = [name for name, _ in net.named_parameters()]
    rows = []
    for step in range(STEPS):
        x, y = _data(rank, step)
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        # every rank's own gradients, from an undistributed copy with the same weights
        local.load_state_dict(net.state_dict())
        local.zero_grad()
        nn.functional.cross_entropy(local(x), y).backward()
        mine = torch.cat([p.grad.reshape(-1) for p in local.parameters()])
        every = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(every, mine)
        got = {name: p.grad.clone() for name, p in net.named_parameters()}
        rows.append((every, got, {k: dict(v) for k, v in state.treatment_stats().items()}))
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
    layout = [(b.treatment, [e[0] for e in b.entries]) for b in state._layout.buckets]
    ordinals = {name: state._layout.ordinals[id(p)] for name, p in net.named_parameters()}
    residuals = state.local_state_dict()["residuals"]
    return names, rows, layout, ordinals, {k: v.clone() for k, v in residuals.items()}, \
        [tuple(p.shape) for p in net.parameters()]


def _topk_sum(grads: list[torch.Tensor], k: int) -> torch.Tensor:
    total = torch.zeros_like(grads[0])
    for g in grads:
        idx = g.abs().argsort(descending=True)[:k]
        total[idx] += g[idx]
    return total


@pytest.mark.distributed
@pytest.mark.parametrize("bucket_cap_mb", [0.015, 25.0])
def test_mixed_treatments_in_one_bucket_reduce_as_their_references(bucket_cap_mb):
    """Step 0 (no residuals yet): each dense parameter is the plain average; each sparse
    treatment's parameters, gathered in bucket order, are top-k's sum at the k of their own
    group. Every step: what the ranks sent plus what they kept equals what they computed
    (conservation per treatment), and dense parameters keep no residual."""
    P = 2
    runs = spawn(_mixed, P, bucket_cap_mb, timeout=180)
    names, rows, layout, ordinals, _, shapes = runs[0]
    numel = {name: math.prod(shape) for name, shape in zip(names, shapes)}
    offsets, at = {}, 0
    for name in names:
        offsets[name] = at
        at += numel[name]
    by_ordinal = {o: n for n, o in ordinals.items()}
    treatments = {by_ordinal[o]: t for t, members in layout for o in members}
    assert treatments["norm.weight"] == "dense" and treatments["head.weight"] == "density=0.2"
    assert treatments["body.weight"] == "default" and treatments["embed.weight"] == "dense"
    if bucket_cap_mb > 1:   # one DDP bucket, split in three
        assert sorted(t for t, _ in layout) == ["default", "dense", "density=0.2"]

    def piece(flat, name):
        return flat[offsets[name]:offsets[name] + numel[name]]

    every, got, stats = rows[0]
    for treatment, members in layout:
        member_names = [by_ordinal[o] for o in members]
        if treatment == "dense":
            for name in member_names:
                want = sum(piece(g, name) for g in every) / P
                torch.testing.assert_close(got[name].reshape(-1), want, rtol=0, atol=1e-7)
            continue
        density = 0.2 if treatment == "density=0.2" else DENSITY
        group = [torch.cat([piece(g, name) for name in member_names]) for g in every]
        want = _topk_sum(group, max(1, math.ceil(density * group[0].numel()))) / P
        have = torch.cat([got[name].reshape(-1) for name in member_names])
        torch.testing.assert_close(have, want, rtol=1e-6, atol=1e-7)
    assert set(stats) == {"dense", "default", "density=0.2"} and all(s["bytes_sent"] > 0 for s in stats.values())
    assert stats["dense"]["n"] == sum(numel[n] for n, t in treatments.items() if t == "dense")

    # conservation per parameter over every step: sum of gradients == P * sum of results + residuals
    for name in names:
        computed = sum(piece(g, name) for rank_rows in [rows] for every, _, _ in rank_rows for g in every)
        sent = sum(P * got[name].reshape(-1) for _, got, _ in rows)
        kept = sum(run[4].get(ordinals[name], torch.zeros(numel[name])).reshape(-1) for run in runs)
        if treatments[name] == "dense":
            assert all(ordinals[name] not in run[4] or not run[4][ordinals[name]].any() for run in runs)
        torch.testing.assert_close(sent + kept, computed, rtol=1e-5, atol=1e-5)


def _disagree(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(Net())
    policy = sc.Policy() if rank == 0 else sc.Policy(dense_below=100)
    sc.register(model, sc.DDPHookState("topka", 0.05, policy=policy))
    x, y = _data(rank, 0)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
    except ValueError as exc:   # AgreedValueError, or a later bucket's failure naming it
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.distributed
def test_ranks_with_different_policies_raise_together():
    for msg in spawn(_disagree, 2, timeout=120):
        assert msg is not None and "policies differ" in msg


def _unbound(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(Net())
    model.register_comm_hook(sc.DDPHookState("topka", 0.05, policy=POLICY), sc.ddp_hook)
    x, y = _data(rank, 0)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
    except (ValueError, RuntimeError) as exc:
        return str(exc)
    return None


@pytest.mark.distributed
def test_rules_by_name_without_the_model_say_how_to_register():
    for msg in spawn(_unbound, 2, timeout=120):
        assert msg is not None and "sparsecomm.register(model, state)" in msg


# -- through FSDP2 ------------------------------------------------------------------------------

def _fsdp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.LayerNorm(20), nn.ReLU(), nn.Linear(20, 15), nn.ReLU(),
                         nn.Linear(15, 4))


def _fsdp_worker(rank, world_size, policy_state, steps):
    from torch.distributed.fsdp import fully_shard

    topology = sc.Topology(2, 2)
    mesh = sc.fsdp.node_mesh(topology)
    model = _fsdp_model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[5], mesh=mesh)
    fully_shard(model, mesh=mesh)    # the root: LayerNorm and the middle Linear
    state = sc.FSDPHookState("topka", 0.1, nodes=topology, policy=sc.hooks.policy.Policy.from_state(policy_state))
    sc.fsdp.register_hook(model, state)
    calls = []
    inner = state._reduce

    def recording(label, group, output):
        before = output.detach().clone()
        inner(label, group, output)
        calls.append((label, before, output.detach().clone()))
    state._reduce = recording
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first_grads, every = None, None
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * rank + step)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if step == 0:   # the hook's sharded gradients, and every rank's own unsharded ones
            first_grads = {n: p.grad.to_local().clone().numpy() for n, p in model.named_parameters()}
            local = _fsdp_model()
            nn.functional.cross_entropy(local(x), y).backward()
            mine = torch.cat([p.grad.reshape(-1) for p in local.parameters()])
            every = [torch.empty_like(mine) for _ in range(world_size)]
            torch.distributed.all_gather(every, mine)
            every = [t.numpy() for t in every]
        opt.step()
    parts = {label: [(t, list(p)) for t, p in parts] for label, parts in state._parts.items()}
    stats = {k: {"treatment": v.get("treatment"), "bytes_sent": v.get("bytes_sent")} for k, v in state.last_stats.items()}
    out = ([(label, a.numpy(), b.numpy()) for label, a, b in calls], parts, divmod(rank, 2), stats,
           [p.detach().to_local().numpy().copy() for p in model.parameters()], first_grads, every)
    state.close()
    return out


FSDP_POLICY = sc.Policy([sc.Rule(sc.Treatment(density=0.5), name="5.weight")], dense_below=0)


@pytest.mark.distributed
def test_fsdp_mixed_treatments_reduce_as_their_references():
    """2 nodes x 2: each module's shard split by treatment; the first call of each module (no
    residual yet): dense parts are the average over nodes, sparse parts top-k's sum at their own k."""
    runs = spawn(_fsdp_worker, 4, FSDP_POLICY.to_state(), 1, timeout=180)
    treatments = {t for _, parts, _, _, _, _, _ in runs for p in parts.values() for t, _ in p}
    assert treatments == {"dense", "default", "density=0.5"}
    # independent of the hook's offsets: the dense parameters' sharded gradients are the shards of
    # the mean over the 4 ranks of their own gradients (FSDP averages in the node, the hook over nodes)
    shapes = [(name, p.shape) for name, p in _fsdp_model().named_parameters()]
    for run in runs:
        local_rank, grads, every = run[2][1], run[5], [torch.from_numpy(t) for t in run[6]]
        at = 0
        for name, shape in shapes:
            n = math.prod(shape)
            if len(shape) == 1:   # 1-D: dense by the policy's defaults
                mean = sum(t[at:at + n] for t in every).reshape(shape) / 4
                want = torch.chunk(mean, 2, dim=0)[local_rank]
                torch.testing.assert_close(torch.from_numpy(grads[name]), want, rtol=1e-5, atol=1e-7)
            at += n
    for local in (0, 1):
        pair = [run for run in runs if run[2][1] == local]    # the two ranks that reduce shard `local`
        for i, (label, _, _) in enumerate(pair[0][0]):
            ins = [torch.from_numpy(run[0][i][1]) for run in pair]
            out = torch.from_numpy(pair[0][0][i][2])
            assert all(run[0][i][0] == label for run in pair)
            for treatment, pieces in pair[0][1][label]:
                def cut(t):
                    return torch.cat([t[o:o + n] for o, n in pieces])
                if treatment == "dense":
                    want = sum(cut(t) for t in ins) / 2
                else:
                    density = 0.5 if treatment == "density=0.5" else 0.1
                    n = sum(n for _, n in pieces)
                    want = _topk_sum([cut(t) for t in ins], max(1, math.ceil(density * n))) / 2
                torch.testing.assert_close(cut(out), want, rtol=1e-6, atol=1e-7)
    assert any(s["treatment"] == "dense" and s["bytes_sent"] > 0 for s in runs[0][3].values())


@pytest.mark.distributed
def test_fsdp_policy_all_dense_is_native_hsdp():
    """Every parameter dense by the policy: the hook's average is HSDP's over 2 nodes."""
    all_dense = sc.Policy([sc.Rule("dense")])
    runs = spawn(_fsdp_worker, 4, all_dense.to_state(), 2, timeout=180)
    for local in (0, 1):
        pair = [run for run in runs if run[2][1] == local]
        for i in range(len(pair[0][0])):
            want = sum(torch.from_numpy(run[0][i][1]) for run in pair) / 2
            for run in pair:
                assert torch.equal(torch.from_numpy(run[0][i][2]), want)


def _fsdp_resume_worker(rank, world_size, saved=None):
    import io

    from torch.distributed.fsdp import fully_shard

    topology = sc.Topology(2, 2)
    mesh = sc.fsdp.node_mesh(topology)
    model = _fsdp_model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[5], mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = sc.FSDPHookState("spardl", 0.1, nodes=topology, policy=FSDP_POLICY)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start, checkpoint = 0, None
    if saved is not None:
        params, hook = saved[rank]
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                p.to_local().copy_(torch.from_numpy(value))
        state.load_state_dict(torch.load(io.BytesIO(hook)))
        start = 2
    sc.fsdp.register_hook(model, state)
    for step in range(start, 4):
        if step == 2 and saved is None:
            buf = io.BytesIO()
            torch.save(state.state_dict(), buf)
            checkpoint = ([p.detach().to_local().numpy().copy() for p in model.parameters()], buf.getvalue())
        g = torch.Generator().manual_seed(10 * rank + step)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    names = sorted(state.local_state_dict()["reducers"])
    state.close()
    return [p.detach().to_local().numpy().copy() for p in model.parameters()], checkpoint, names


@pytest.mark.distributed
def test_fsdp_resume_with_a_policy_is_bit_exact():
    first = spawn(_fsdp_resume_worker, 4, timeout=180)
    assert any("#density=0.5" in name for name in first[0][2]), first[0][2]
    second = spawn(_fsdp_resume_worker, 4, [run[1] for run in first], timeout=180)
    for (want, _, _), (got, _, _) in zip(first, second):
        assert all((a == b).all() for a, b in zip(want, got))


def _fsdp_disagree(rank, world_size):
    from torch.distributed.fsdp import fully_shard

    topology = sc.Topology(2, 1)
    model = _fsdp_model()
    fully_shard(model, mesh=sc.fsdp.node_mesh(topology))
    policy = FSDP_POLICY if rank == 0 else sc.Policy()
    try:
        sc.fsdp.register_hook(model, sc.FSDPHookState("topka", 0.1, nodes=topology, policy=policy))
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.distributed
def test_fsdp_ranks_with_different_policies_raise_together_at_registration():
    for msg in spawn(_fsdp_disagree, 2, timeout=120):
        assert msg is not None and "policies differ" in msg


def _summary(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Linear(100, 10))     # 1000 weights through topka, 10 biases dense
    state = sc.register(model, sc.DDPHookState("topka", 0.01, policy=sc.Policy(dense_below=0), async_comm=False))
    model(torch.randn(8, 100)).square().mean().backward()
    line = state.summary()
    state.close()
    return line


@pytest.mark.distributed
def test_the_summary_names_the_dense_parameters_share():
    line = spawn(_summary, 2, timeout=120)[0]
    # the biases' ring allreduce: 2 (P - 1) ceil(40 / P) = 40 bytes of the total
    assert line.startswith("step 1: topka, density 0.01: sent ") and ", 2 buckets (40 B of it dense parameters)" in line, line


def test_a_dense_part_keeps_its_velocity_under_momentum_masking():
    """Masking clears the velocity where a call sent; a dense part sends every coordinate, so its
    reducer runs without masking (its parameters keep momentum SGD's update)."""
    from sparsecomm.comm.simulated import simulate

    state = sc.DDPHookState("topka", 0.1, momentum=0.9, momentum_masking=True, policy="default")

    def fn(comm):
        return state._new_reducer(comm, "dense").local_update, state._new_reducer(comm, "default").local_update
    dense, default = simulate(2, fn).results[0]
    assert dense.momentum == 0.9 and not dense.momentum_masking
    assert default.momentum == 0.9 and default.momentum_masking


def _nan_in_a_dense_parameter(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = Net()
    if rank == 1:
        net.out.bias.register_hook(lambda g: g * float("nan"))
    model = DDP(net)
    state = sc.register(model, sc.DDPHookState("topka", 0.05, policy="default", nonfinite="raise"))
    x, y = _data(rank, 0)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
    except ValueError as exc:
        return str(exc)
    finally:
        state.close()
    return None


@pytest.mark.distributed
def test_nonfinite_raise_covers_the_dense_parameters():
    for msg in spawn(_nan_in_a_dense_parameter, 2, timeout=120):
        assert msg is not None and "NaN" in msg and "rank" in msg, msg
