"""SparseDDPStrategy with the real Lightning package on CPU (tests/_lightning_program.py):
the hook reduces every step (Lightning's own DDPStrategy registers comm hooks on CUDA only),
and a checkpoint resumed in fresh processes continues bit-identically on every rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lightning", reason="Lightning is not installed: pip install 'lightning>=2.2,<3'")

import sparsecomm as sc  # noqa: E402
from sparsecomm.integrations.lightning import CHECKPOINT_KEY, SparseDDPStrategy  # noqa: E402
from sparsecomm.testing import free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "_lightning_program.py")


def _run(out, *args, ranks=2, check=True):
    os.makedirs(out, exist_ok=True)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    if ranks > 1:   # the processes exist already: Lightning's environment, no launcher
        env.update(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, PROGRAM, "--out", str(out), "--devices", str(ranks), *args],
                              env={**env, **({"LOCAL_RANK": str(r)} if ranks > 1 else {})}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(ranks)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            p.kill()
    if not check:
        return [p.returncode for p in procs], logs
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(ranks)], logs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    results, _ = _run(tmp / "a", "--save", str(tmp / "ckpt"))
    return tmp, results


def test_the_hook_reduces_every_step_on_cpu(uninterrupted):
    _, results = uninterrupted
    for r in results:
        assert r["step"] == 6 and len(r["reduced"]) == 6 and min(r["reduced"]) >= 1
    assert torch.equal(results[0]["params"], results[1]["params"])


def test_the_checkpoint_holds_every_ranks_part_and_resumes_bit_identically(uninterrupted):
    tmp, first = uninterrupted
    ckpt = tmp / "ckpt" / "epoch=0.ckpt"
    saved = torch.load(ckpt, weights_only=True)[CHECKPOINT_KEY]
    assert sorted(k for k in saved if k.startswith("rank")) == ["rank0", "rank1"]
    second, _ = _run(tmp / "b", "--resume", str(ckpt))
    for rank in range(2):
        assert second[rank]["step"] == 6 and second[rank]["reduced"] == [1, 1, 1]
        assert torch.equal(first[rank]["params"], second[rank]["params"]), f"rank {rank} drifted after resume"


def test_a_world_size_change_on_resume_is_the_same_error_on_every_rank(uninterrupted):
    """Saved by 2 processes, resumed by 3 (``trainer.fit(ckpt_path=...)``): every process ends
    with the ValueError that names the world-size change, within seconds (before: the added rank
    raised alone and the others waited in the Comm's construction for the group's timeout)."""
    import time

    tmp, _ = uninterrupted
    start = time.monotonic()
    codes, logs = _run(tmp / "c", "--resume", str(tmp / "ckpt" / "epoch=0.ckpt"), ranks=3, check=False)
    assert time.monotonic() - start < 200
    for rank, (code, log) in enumerate(zip(codes, logs)):
        assert code != 0 and "saved by a run of 2 ranks; this run has 3" in log, (rank, code, log[-3000:])


def test_a_one_process_run_trains_through_the_hook(tmp_path):
    (only,), _ = _run(tmp_path, ranks=1)
    assert only["step"] == 6


def test_the_strategy_refuses_another_hook_and_a_non_state():
    with pytest.raises(ValueError, match=r"drop \['ddp_comm_hook'\]"):
        SparseDDPStrategy(sc.DDPHookState("topka", 0.1), ddp_comm_hook=sc.ddp_hook)
    with pytest.raises(TypeError, match="a sparsecomm.DDPHookState, got str"):
        SparseDDPStrategy("topka")


@pytest.mark.parametrize("nproc", [2, 1])
def test_the_lightning_example_prints_what_the_hook_reduced(nproc, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_lightning.py"), "--nproc", str(nproc),
                           "--steps", "4", "--log-every", "2", "--algorithm", "topka", "--train-size", "512",
                           "--test-size", "64"], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    steps = re.findall(r"^step (\d+): topka, density 0\.01: sent ([\d.]+) k?B(?: = ([\d.]+)x dense's [\d.]+ [kM]B| "
                       r"\(1 rank: nothing to send\)), (\d+) buckets?(?: \(\+\d+ B setup\))?; loss ([\d.]+)$",
                       proc.stdout, re.M)
    assert [s[0] for s in steps] == ["1", "2", "4"], proc.stdout
    assert all(int(s[3]) >= 1 and float(s[4]) > 0 for s in steps)   # buckets, and the training loss
    assert all((float(s[1]) > 0) == (nproc > 1) for s in steps)   # one process sends nothing
    assert all(0 < float(s[2]) < 1 for s in steps if nproc > 1)     # far fewer bytes than dense
    assert re.search(rf"^done: {nproc} processes, topka at density 0.01, hook step 4, test accuracy [\d.]+$",
                     proc.stdout, re.M), proc.stdout
