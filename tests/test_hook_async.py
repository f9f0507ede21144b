"""The non-blocking DDP hook (async_comm=True, the default): same results as the blocking
hook bit for bit, the Future returned before communication ends, worker errors raised in
the training loop (never a hang), and a state that still pickles."""

from __future__ import annotations

import pickle
import time

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.comm import TorchComm
from sparsecomm.testing import spawn

STEPS = 6


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 4))


class SlowComm(TorchComm):
    """A TorchComm that sleeps before every round (a slow link) and can fail from a given round."""

    def __init__(self, delay=0.0, fail_after=None):
        super().__init__()
        self.delay, self.fail_after, self.calls = delay, fail_after, 0

    def _post_and_wait(self, sends, recvs):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("injected link failure")
        if self.delay:
            time.sleep(self.delay)
        return super()._post_and_wait(sends, recvs)


def _train(rank, algorithm, density, async_comm, comm=None, record=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(), bucket_cap_mb=0.004)
    state = sc.DDPHookState(algorithm, density, comm=comm, async_comm=async_comm)

    def hook(st, bucket):
        fut = sc.ddp_hook(st, bucket)
        if record is not None:
            record.append(fut.done())
        return fut
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x = torch.randn(64, 16, generator=gen)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return state, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank(rank, world_size):
    out = {}
    for alg, density in (("topka", 0.05), ("sparcml_split_allgather", 0.05)):
        _, sync = _train(rank, alg, density, False)
        state, asyn = _train(rank, alg, density, True)
        out[alg] = (sync.numpy(), asyn.numpy())
        blob = pickle.dumps(state)  # the worker thread is not pickled
        clone = pickle.loads(blob)
        out[alg + "_pickle"] = (clone.async_comm, clone._worker is None, len(clone.state_dict()["residuals"]))
    # the Future comes back before a slow link has carried the bucket
    done = []
    _train(rank, "topka", 0.05, True, comm=SlowComm(delay=0.02), record=done)
    out["done_at_return"] = done
    # a failing link: the exception reaches backward(), the next step fails too (no hang)
    errors = []
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(), bucket_cap_mb=0.004)
    state = sc.DDPHookState("topka", 0.05, comm=SlowComm(fail_after=3))
    model.register_comm_hook(state, sc.ddp_hook)
    for _ in range(3):
        try:
            model(torch.randn(8, 16)).sum().backward()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001
            errors.append(str(exc))
    out["errors"] = errors
    return out


@pytest.mark.distributed
def test_async_hook_matches_sync_overlaps_and_fails_cleanly():
    results = spawn(_rank, 2, timeout=180)
    for rank, res in enumerate(results):
        for alg in ("topka", "sparcml_split_allgather"):
            sync, asyn = res[alg]
            assert (sync == asyn).all(), f"rank {rank} {alg}: async result differs from sync"
            assert (sync == results[0][alg][0]).all()
            assert res[alg + "_pickle"][0] is True and res[alg + "_pickle"][1] and res[alg + "_pickle"][2] > 0
        assert res["done_at_return"] and not any(res["done_at_return"]), res["done_at_return"]
        errors = res["errors"]
        assert errors[0] is None and "injected link failure" in (errors[1] or "") or \
            any("injected link failure" in (e or "") for e in errors), errors
        assert errors[-1] is not None, errors  # keeps failing, never hangs


def test_async_comm_validated_and_default():
    assert sc.DDPHookState("topka", 0.1).async_comm is True
    with pytest.raises(ValueError, match="async_comm"):
        sc.DDPHookState("topka", 0.1, async_comm="yes")
    state = sc.DDPHookState("topka", 0.1, async_comm=False)
    assert pickle.loads(pickle.dumps(state)).async_comm is False
