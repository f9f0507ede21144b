"""sparsecomm.integrations.accelerate with the real Hugging Face Accelerate on CPU: the hook on
the prepared DDP model reduces once per optimizer step under gradient accumulation, and
``save_state`` / ``load_state`` in fresh processes continue bit-identically; a 1-process run
trains with the bare module; misconfigured runs are refused.

Two processes come from sparsecomm.testing.spawn: Accelerate attaches to the process group
that is already initialized when the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE) are set, as torchrun sets them (examples/train_accelerate.py runs under
torch.distributed.run itself: tests/test_examples_training.py). About 15-25 s on 2 cores.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import warnings

import pytest
import torch

import sparsecomm as sc
import sparsecomm.hook as hook_module
from sparsecomm.testing import spawn

MICRO, ACCUM, SAVE_AT = 10, 2, 4    # micro-batches, micro-batches per optimizer step, save after micro 4
NEEDS = "Hugging Face Accelerate is not installed (pip install 'accelerate>=1.0'): its integration is untested"


@pytest.fixture
def accelerate():
    return pytest.importorskip("accelerate", reason=NEEDS)


@pytest.fixture
def fresh_accelerate_state(accelerate):
    """Accelerate keeps its process state in class-level singletons: a test that builds an
    Accelerator in this process resets them afterwards (as Accelerate's own tests do)."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _batch(rank, micro):
    g = torch.Generator().manual_seed(1000 * micro + rank)
    return torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def _train(rank, world_size, checkpoint_dir, resume):
    # what torchrun sets; Accelerate reads them and joins the group spawn() initialized
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    from sparsecomm.integrations.accelerate import register

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM, mixed_precision="bf16",
                              kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=0.001)])
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = register(accelerator, model, sc.DDPHookState("topka", 0.05))
    start = 0
    if resume:
        accelerator.load_state(checkpoint_dir)
        start = SAVE_AT
    seen = []   # per micro-batch: (synchronized, hook step after it, buckets it reduced, bytes they sent)
    for micro in range(start, MICRO):
        x, y = _batch(rank, micro)
        state.last_stats.clear()
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        stats = state.last_stats.values()
        seen.append((accelerator.sync_gradients, state.step, sum(s["nnz_out"] > 0 for s in stats),
                     sum(s["bytes_sent"] for s in stats)))
        if not resume and micro + 1 == SAVE_AT:
            accelerator.save_state(checkpoint_dir)
    refused = None
    if not resume:   # the same run as 2 nodes of 1 process, each node's first process writing a file
        from sparsecomm.integrations.accelerate import HookCheckpoint

        accelerator.project_configuration.save_on_each_node = True
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        try:
            HookCheckpoint(state, accelerator).state_dict()
        except ValueError as exc:
            refused = str(exc)
    state.close()
    params = torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    # numpy, not a tensor: Accelerate imports torch.multiprocessing, whose pickling would hand the
    # parent a shared-memory handle that dies with this process
    return params.numpy(), seen, accelerator.distributed_type.value, refused


def test_two_processes_reduce_every_optimizer_step_and_resume_bit_identically(accelerate, tmp_path):
    checkpoint_dir = str(tmp_path / "checkpoint")
    first = spawn(_train, 2, checkpoint_dir, False, timeout=240)
    for params, seen, mode, refused in first:
        assert mode == "MULTI_CPU"
        assert "(save_on_each_node=True) on several nodes" in refused   # on every rank, before any message
        # no_sync on the accumulating micro-batches: the hook runs on the synchronizing ones only,
        # reducing every bucket, and counts optimizer steps
        assert [s[0] for s in seen] == [(m + 1) % ACCUM == 0 for m in range(MICRO)]
        assert [s[1] for s in seen] == [(m + 1) // ACCUM for m in range(MICRO)]
        assert all(s[2] >= 1 and s[3] > 0 for s in seen if s[0]), seen
        # DDP's first bucket holds everything (1 MB); its rebuilt ones are of 0.001 MB: the resume
        # below crosses the hook's change of layout
        assert seen[-1][2] >= 2, seen
        assert all(s[2] == 0 for s in seen if not s[0]), seen
    assert (first[0][0] == first[1][0]).all(), "the ranks' parameters differ: gradients were not averaged"
    # the one file the main process wrote holds both ranks' parts, as opaque bytes
    written = torch.load(os.path.join(checkpoint_dir, "custom_checkpoint_0.pkl"), weights_only=True)
    assert written["sparsecomm"] == "DDPHookState" and written["world_size"] == 2
    assert sorted(k for k in written if k.startswith("rank")) == ["rank0", "rank1"]
    assert all(isinstance(written[k], bytes) for k in ("rank0", "rank1"))
    resumed = spawn(_train, 2, checkpoint_dir, True, timeout=240)
    for rank in range(2):
        assert (first[rank][0] == resumed[rank][0]).all(), f"rank {rank} drifted after load_state"
        assert resumed[rank][1] == first[rank][1][SAVE_AT:]   # the step count went on from the save


def _resume_with_another_world_size(rank, world_size, checkpoint_dir):
    import time

    start = time.monotonic()
    try:
        _train(rank, world_size, checkpoint_dir, True)
    except ValueError as exc:
        return "ValueError", str(exc), time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None, "", time.monotonic() - start


def test_a_world_size_change_at_load_state_is_the_same_error_on_every_rank(accelerate, tmp_path):
    """Saved by 2 processes, resumed by 3 with ``load_state``: every process raises the
    ValueError that names the world-size change, within seconds (before: the added rank raised
    alone and the others waited in the Comm's construction for the process group's timeout)."""
    checkpoint_dir = str(tmp_path / "checkpoint")
    spawn(_train, 2, checkpoint_dir, False, timeout=240)
    outs = spawn(_resume_with_another_world_size, 3, checkpoint_dir, timeout=240)
    for rank, (kind, msg, seconds) in enumerate(outs):
        assert kind == "ValueError" and "saved by a run of 2 ranks; this run has 3" in msg, (rank, kind, msg)
        assert seconds < 60, (rank, seconds)


def test_a_one_process_run_trains_the_bare_module_says_so_once_and_checkpoints(
        accelerate, fresh_accelerate_state, monkeypatch, tmp_path):
    from accelerate import Accelerator

    from sparsecomm.integrations.accelerate import register

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hook_module, "_told_one_process", False)
    accelerator = Accelerator(cpu=True)
    model = _net()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = register(accelerator, model, sc.DDPHookState("topka", 0.05))
        register(accelerator, _net(), sc.DDPHookState("topka", 0.05))
    said = [w for w in caught if "1-process run: there is nothing to reduce" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__   # once, about this file's call
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    x, y = _batch(0, 0)
    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
    optimizer.step()
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert not torch.equal(before, after) and state.step == 0   # trained; nothing went through a hook
    accelerator.save_state(str(tmp_path))
    accelerator.load_state(str(tmp_path))


@pytest.mark.parametrize("setting,message", [
    ("launched_without_cpu", "2 processes were launched (WORLD_SIZE=2) but this Accelerator runs 1 process"),
    ("own_comm_hook", "registers its own DDP comm hook (fp16"),
])
def test_misconfigured_runs_are_refused_before_anything_registers(
        accelerate, fresh_accelerate_state, monkeypatch, setting, message):
    from accelerate import Accelerator
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    from sparsecomm.integrations.accelerate import register

    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    if setting == "launched_without_cpu":   # torchrun's WORLD_SIZE, and an Accelerator that runs 1 process
        monkeypatch.setenv("WORLD_SIZE", "2")  # (as Accelerator() does under torchrun on a machine without GPUs)
        accelerator = Accelerator()
    else:
        accelerator = Accelerator(cpu=True, kwargs_handlers=[
            DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)])
    with pytest.raises(ValueError, match=re.escape(message)):
        register(accelerator, _net(), sc.DDPHookState("topka", 0.05))


def test_importing_it_without_accelerate_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)   # what an absent package looks like to import
    monkeypatch.delitem(sys.modules, "sparsecomm.integrations.accelerate", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'accelerate>=1\.0' .*pip install '\.\[accelerate\]'"):
        importlib.import_module("sparsecomm.integrations.accelerate")


def test_save_state_on_the_main_process_only_times_out_saying_so(accelerate, fresh_accelerate_state, monkeypatch):
    from accelerate import Accelerator

    from sparsecomm.comm import CommTimeoutError, simulate
    from sparsecomm.integrations.accelerate import HookCheckpoint

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    accelerator = Accelerator(cpu=True)

    def main_process_saves(comm):   # rank 1 never joins, as under `if accelerator.is_main_process`
        if comm.rank == 0:
            HookCheckpoint(sc.DDPHookState("topka", 0.05, comm=comm), accelerator).state_dict()

    with pytest.raises(CommTimeoutError, match="call save_state on every process, not only under"):
        simulate(2, main_process_saves, timeout=0.5)
