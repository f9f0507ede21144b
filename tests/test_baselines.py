"""PyTorch's hooks as baselines (sparsecomm.bench.baselines): flat-tensor runs, DDP runs, wire counts."""
import math

import numpy as np
import pytest
import torch

from sparsecomm.bench.baselines import TorchHook, bucket_shapes, powersgd_counts
from sparsecomm.comm.base import ring_allreduce_cost
from sparsecomm.testing import spawn


@pytest.mark.parametrize("n", [0, 5, 511, 512, 513, 512 * 4608, 512 * 4608 * 2 + 1000, 15_000_000])
def test_bucket_shapes_cover_n_with_matrices_first(n):
    shapes = bucket_shapes(n)
    assert sum(math.prod(s) for s in shapes) == n
    vectors = [s for s in shapes if len(s) == 1]
    assert len(vectors) <= 1 and all(v[0] < 512 for v in vectors)
    assert all(len(s) == 2 for s in shapes[:-1])


@pytest.mark.parametrize("shapes, rank, expected", [
    ([(10,)], 4, (10, 0, 0)),                                  # vectors never compress
    ([(512, 4608)], 4, (0, 512 * 4, 4608 * 4)),
    ([(8, 8)], 4, (64, 0, 0)),                                 # (8+8)*4*2 = 128 >= 64
    ([(64, 3, 3, 3)], 1, (0, 64, 27)),                         # viewed as 64 x 27
    ([(40, 1000)], 8, (0, 320, 8000)),
    ([(3, 100)], 8, (300, 0, 0)),                              # r' = min(n, m, r) = 3: no gain
    ([(512, 4608), (7,)], 2, (7, 1024, 9216)),
])
def test_powersgd_counts_mirror_the_compress_rule(shapes, rank, expected):
    assert powersgd_counts(shapes, rank) == expected


@pytest.mark.parametrize("kwargs", [{"powersgd_rank": 0}, {"powersgd_rank": 1.5}, {"start_powerSGD_iter": 1},
                                    {"min_compression_rate": 0}])
def test_bad_options_raise(kwargs):
    with pytest.raises(ValueError):
        TorchHook("torch_powersgd", **kwargs)


def test_unknown_name_raises():
    with pytest.raises(ValueError, match="torch_fp16"):
        TorchHook("fp16")


def _flat_worker(rank, world, name, n, steps):
    import torch.distributed as dist

    hook = TorchHook(name, powersgd_rank=2)
    shapes = bucket_shapes(n, rows=16, cols=48)
    rows = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        grad = torch.randn(n, generator=gen, dtype=torch.float64)
        previous = hook.residual()
        acc = grad + (previous if previous is not None else 0)
        out = hook.allreduce(grad.clone(), shapes).clone()
        res = hook.residual()
        rows.append((grad.numpy(), acc.numpy(), out.numpy(),
                     None if res is None else res.clone().numpy(), dict(hook.last_stats[0]), hook.summary()))
    return rows


@pytest.mark.parametrize("world", [2, 3])
def test_fp16_hook_on_a_flat_tensor_is_the_mean_in_half_precision(world):
    n = 16 * 48 * 2 + 37
    results = spawn(_flat_worker, world, "torch_fp16", n, 2)
    for step in range(2):
        outs = [results[r][step][2] for r in range(world)]
        assert all(np.array_equal(o, outs[0]) for o in outs)
        mean = sum(results[r][step][0] for r in range(world)) / world
        # each rank's share g/P is rounded to half, then summed in half: a few half ulps
        assert np.abs(outs[0] - mean).max() <= 4 * 2.0 ** -10 * np.abs(mean).max()
        stats = results[0][step][4]
        assert (stats["bytes_sent"], stats["rounds"]) == ring_allreduce_cost(2 * n, world)
    if world == 2:   # 1573 float64 sent as float16: 2 (P - 1) ceil(2 n / P) = 3146 B of dense's 12584 B
        assert results[0][0][5] == "torch_fp16: sent 3.15 kB = 0.25x dense's 12.6 kB, 1 bucket"


@pytest.mark.parametrize("world", [2, 3])
def test_powersgd_hook_on_a_flat_tensor_conserves_with_error_feedback(world):
    n = 16 * 48 * 2 + 37
    steps = 4  # 2 of vanilla allreduce, then compressed
    results = spawn(_flat_worker, world, "torch_powersgd", n, steps)
    for step in range(steps):
        outs = [results[r][step][2] for r in range(world)]
        assert all(np.allclose(o, outs[0], rtol=0, atol=1e-12) for o in outs)
        stats = results[0][step][4]
        if step < 2:
            mean = sum(results[r][step][0] for r in range(world)) / world
            assert np.allclose(outs[0], mean, rtol=1e-12, atol=1e-12)
            assert (stats["bytes_sent"], stats["rounds"]) == ring_allreduce_cost(8 * n, world)
            continue
        # what PowerSGD promises: each compressed 16 x 48 matrix comes back with rank <= 2
        for block in range(2):
            matrix = outs[0][block * 16 * 48:(block + 1) * 16 * 48].reshape(16, 48)
            assert np.linalg.matrix_rank(matrix, tol=1e-9 * np.abs(matrix).max()) <= 2
        # and the error memory we read back is what it kept: e'_r = acc_r - out on every rank
        for r in range(world):
            assert np.allclose(results[r][step][3], results[r][step][1] - outs[0], rtol=0, atol=1e-12)
        # the tail vector (37) went through exactly; the matrices did not
        mean = sum(results[r][step][1] for r in range(world)) / world
        assert np.allclose(outs[0][-37:], mean[-37:], rtol=1e-12, atol=1e-12)
        assert not np.allclose(outs[0][:-37], mean[:-37])
        uncompressed, ps, qs = 37, 2 * 16 * 2, 2 * 48 * 2
        expected = [ring_allreduce_cost(8 * c, world) for c in (uncompressed, ps, qs)]
        assert stats["bytes_sent"] == sum(e[0] for e in expected) < ring_allreduce_cost(8 * n, world)[0]
        assert stats["rounds"] == 3 * 2 * (world - 1)


def _ddp_worker(rank, world, name):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))
    # several buckets in flight at once: PowerSGD on gloo must not interleave their collectives
    ddp = DDP(model, bucket_cap_mb=0.01)
    hook = TorchHook(name, powersgd_rank=2)
    hook.register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    losses, sent = [], []
    for _ in range(6):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randint(0, 4, (16,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        sent.append(sum(s["bytes_sent"] for s in hook.last_stats.values()))
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    return losses, sent, params


def _unused_parameters_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(torch.nn.Linear(4, 4), find_unused_parameters=True)
    try:
        TorchHook("torch_powersgd").register(ddp)
    except ValueError as exc:
        return str(exc)
    return None


def test_powersgd_on_gloo_refuses_ddps_group_with_find_unused_parameters():
    message = spawn(_unused_parameters_worker, 1)[0]
    assert message is not None and "process_group=torch.distributed.new_group()" in message


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", ["torch_fp16", "torch_powersgd"])
def test_registered_on_ddp_keeps_replicas_identical_and_counts_bytes(name, world):
    results = spawn(_ddp_worker, world, name)
    for r in range(1, world):
        assert np.array_equal(results[r][2], results[0][2])   # the same update on every replica
    losses, sent, _ = results[0]
    assert all(math.isfinite(v) for v in losses)
    dense_bytes = ring_allreduce_cost(4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4), world)[0]
    assert 0 < sent[-1] < dense_bytes
