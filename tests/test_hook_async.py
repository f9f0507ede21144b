"""The non-blocking DDP hook (async_comm=True, the default): same results as the blocking
hook bit for bit, the Future returned before communication ends, worker errors raised in
the training loop (never a hang), and a state that still pickles."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.comm import TorchComm
from sparsecomm.testing import spawn

STEPS = 6
GATE_WAIT = 10.0  # seconds a gated round waits before concluding that the hook blocked


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 4))


class GatedComm(TorchComm):
    """A TorchComm whose every round first waits for ``gate``, an Event the test's hook wrapper
    closes while ``ddp_hook`` runs and opens once the hook has returned. A round run inside the
    hook (no overlap) would find the gate closed and raise after ``GATE_WAIT`` seconds."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def _post_and_wait(self, sends, recvs):
        if not self.gate.wait(timeout=GATE_WAIT):
            raise RuntimeError("a round ran while the hook had not returned: the hook blocked on communication")
        return super()._post_and_wait(sends, recvs)


class CountingComm(TorchComm):
    """A TorchComm that counts its rounds and raises from round ``fail_after + 1`` on."""

    def __init__(self, fail_after=None):
        super().__init__()
        self.fail_after, self.calls = fail_after, 0

    def _post_and_wait(self, sends, recvs):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("injected link failure")
        return super()._post_and_wait(sends, recvs)


def _train(rank, algorithm, density, async_comm, comm=None, record=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(), bucket_cap_mb=0.004)
    state = sc.DDPHookState(algorithm, density, comm=comm, async_comm=async_comm)

    def hook(st, bucket):
        gate = getattr(comm, "gate", None)
        if gate is not None:
            gate.clear()
        try:
            fut = sc.ddp_hook(st, bucket)
            if record is not None:
                record.append(fut.done())
        finally:
            if gate is not None:
                gate.set()
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


def _steps_with(comm, steps):
    """Backward passes of the failing-link model; per step None or the error's text."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(), bucket_cap_mb=0.004)
    model.register_comm_hook(sc.DDPHookState("topka", 0.05, comm=comm), sc.ddp_hook)
    gen = torch.Generator().manual_seed(7)
    outcomes, calls = [], []
    for _ in range(steps):
        try:
            model(torch.randn(8, 16, generator=gen)).sum().backward()
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001
            outcomes.append(str(exc))
        calls.append(comm.calls)
    return outcomes, calls


def _rank(rank, world_size):
    out = {}
    for alg, density in (("topka", 0.05), ("sparcml_split_allgather", 0.05)):
        _, sync = _train(rank, alg, density, False)
        state, asyn = _train(rank, alg, density, True)
        out[alg] = (sync.numpy(), asyn.numpy())
        blob = pickle.dumps(state)  # the worker thread is not pickled
        clone = pickle.loads(blob)
        out[alg + "_pickle"] = (clone.async_comm, clone._worker is None, len(clone.local_state_dict()["residuals"]))
    # overlap: no round can run before the hook returns (the gate), so every Future the hook
    # returns is still pending; a hook that communicated inline would raise at the gate
    done = []
    _train(rank, "topka", 0.05, True, comm=GatedComm(), record=done)
    out["done_at_return"] = done
    # a failing link: count the rounds of the first step on a clean link, then fail the first
    # round after them; the next step must raise it and the step after must fail too (no hang)
    _, clean_calls = _steps_with(CountingComm(), 3)
    out["clean_calls"] = clean_calls
    out["errors"], _ = _steps_with(CountingComm(fail_after=clean_calls[0]), 3)
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
        # at least one bucket per step (DDP re-buckets after the first), no Future complete at return
        assert len(res["done_at_return"]) >= STEPS and not any(res["done_at_return"]), res["done_at_return"]
        first, second, third = res["errors"]
        calls = res["clean_calls"]
        assert 0 < calls[0] < calls[1], calls  # step 1 communicates after step 0
        assert first is None, res["errors"]
        assert "injected link failure" in (second or ""), res["errors"]
        assert "an earlier bucket's communication failed" in (third or "") and "injected link failure" in third, \
            res["errors"]


def test_async_comm_validated_and_default():
    assert sc.DDPHookState("topka", 0.1).async_comm is True
    with pytest.raises(ValueError, match="async_comm"):
        sc.DDPHookState("topka", 0.1, async_comm="yes")
    state = sc.DDPHookState("topka", 0.1, async_comm=False)
    assert pickle.loads(pickle.dumps(state)).async_comm is False
