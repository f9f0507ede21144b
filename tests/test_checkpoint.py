"""Checkpoints saved the ways users save them, resumed in fresh processes (docs/reliability.md,
"Resume matrix" and "Checkpoints loaded wrongly").

* one file per rank (``torch.save(state.state_dict(), f"hook_rank{rank}.pt")``) and
  ``torch.distributed.checkpoint`` (model + optimizer + hook state as a ``Stateful``): the
  resumed run is bit-identical to the uninterrupted one;
* rank 0's file loaded on every rank (what users do for the model): the rank that got another
  rank's state raises a ValueError that says what to do; its peer fails too instead of hanging;
* ranks resumed from different saves (rank 0 from step 3, rank 1 from step 2; one rank fresh):
  the same ValueError on every rank, naming the checkpoint;
* a state saved by another number of ranks, or by an older sparsecomm: refused, saying so.

The reference is the uninterrupted run itself (same seeds, same data), never the module's code.
"""

from __future__ import annotations

import io
import os
import time

import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn
from test_resume import _build, _params, _step

CONFIG = "bucket_cap_mb=0.01"


def _save_files(directory: str, rank: int, model, optimizer, state, step: int) -> None:
    """Every rank writes its own file: the README's way."""
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "hook": state.state_dict()}, os.path.join(directory, f"step{step}_rank{rank}.pt"))


def _save_dcp(directory: str, model, optimizer, state, step: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "hook": state},
             checkpoint_id=os.path.join(directory, f"dcp_step{step}"))


def _uninterrupted(rank, world_size, directory, algorithms, steps, save_at):
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    out = {}
    for algorithm in algorithms:
        sub = os.path.join(directory, algorithm)
        os.makedirs(sub, exist_ok=True)
        model, state, optimizer = _build(CONFIG, algorithm, {}, comm, world_size)
        for step in range(steps):
            _step(model, optimizer, CONFIG, rank, step)
            if step + 1 in save_at:
                _save_files(sub, rank, model, optimizer, state, step + 1)
                _save_dcp(sub, model, optimizer, state, step + 1)
        out[algorithm] = _params(model)
    return out


def _resumed(rank, world_size, directory, algorithms, steps, save_at, how):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    out = {}
    for algorithm in algorithms:
        sub = os.path.join(directory, algorithm)
        for t in save_at:
            model, state, optimizer = _build(CONFIG, algorithm, {}, comm, world_size)
            if how == "files":
                saved = torch.load(os.path.join(sub, f"step{t}_rank{rank}.pt"))
                model.module.load_state_dict(saved["model"])
                optimizer.load_state_dict(saved["optimizer"])
                state.load_state_dict(saved["hook"])
            else:
                model_sd, optim_sd = get_state_dict(model, optimizer)
                loaded = {"model": model_sd, "optim": optim_sd, "hook": state}
                dcp.load(loaded, checkpoint_id=os.path.join(sub, f"dcp_step{t}"))
                set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
            for step in range(t, steps):
                _step(model, optimizer, CONFIG, rank, step)
            out[(algorithm, t)] = _params(model)
    return out


def _differences(first, second, world_size, algorithms, save_at) -> dict:
    diffs = {}
    for algorithm in algorithms:
        for t in save_at:
            worst = 0.0
            for rank in range(world_size):
                ref = torch.load(io.BytesIO(first[rank][algorithm]))
                got = torch.load(io.BytesIO(second[rank][(algorithm, t)]))
                for a, b in zip(ref, got):
                    if not torch.equal(a, b):
                        worst = max(worst, float((a.double() - b.double()).abs().max()) or float("nan"))
            diffs[(algorithm, t)] = worst
    return diffs


@pytest.mark.distributed
@pytest.mark.slow
def test_per_rank_files_and_distributed_checkpoint_resume_bit_identically(tmp_path):
    """P = 2, small buckets, three algorithms (spardl's blocks and gssgd's hashes depend on the
    bucket layout, topka the baseline); checkpoints after step 1 (initial layout only) and 3
    (the rebuilt layout adopted); resumed from per-rank torch.save files and from one
    torch.distributed.checkpoint directory (model and optimizer through DCP's get/set_state_dict)."""
    algorithms, steps, save_at = ["topka", "spardl", "gssgd"], 5, (1, 3)
    first = spawn(_uninterrupted, 2, str(tmp_path), algorithms, steps, save_at, timeout=600)
    for how in ("files", "dcp"):
        second = spawn(_resumed, 2, str(tmp_path), algorithms, steps, save_at, how, timeout=600)
        diffs = _differences(first, second, 2, algorithms, save_at)
        inexact = {key: d for key, d in diffs.items() if d != 0.0}
        assert not inexact, f"{how}: {len(inexact)} of {len(diffs)} resumes differ: {inexact}"


# -- loaded wrongly ----------------------------------------------------------------------

def _train_and_save_rank0_only(rank, world_size, directory, steps):
    """The usual model checkpoint: rank 0 saves one file."""
    import torch.distributed as dist

    from sparsecomm.comm.torch_comm import TorchComm

    model, state, optimizer = _build(CONFIG, "topka", {}, TorchComm(timeout=60), world_size)
    for step in range(steps):
        _step(model, optimizer, CONFIG, rank, step)
        _save_files(directory, rank, model, optimizer, state, step + 1)   # per rank too, for the mixes
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "hook": state.state_dict()}, os.path.join(directory, f"ckpt{step + 1}.pt"))
    state._drain()
    dist.barrier()


def _load_and_train(rank, world_size, directory, plan, report):
    """Load what ``plan[rank]`` names (None: start fresh) and train two steps; write what
    happened to ``report`` (a rank that cannot load exits, as a user's script would)."""
    from sparsecomm.comm.torch_comm import TorchComm

    model, state, optimizer = _build(CONFIG, "topka", {}, TorchComm(timeout=30), world_size)
    source = plan[rank]

    def load():
        if source is not None:
            saved = torch.load(os.path.join(directory, source))
            model.module.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            state.load_state_dict(saved["hook"])

    return _load_then_train_two_steps(rank, model, optimizer, load, report)


def _load_then_train_two_steps(rank, model, optimizer, load, report):
    """Run ``load()``, then two training steps, as a user's script would, and write what
    happened to ``report.<rank>``: a ValueError at load ends the process (exit 3) after the
    report, an error in training is recorded with its type and message and the time it took."""
    outcome = {"rank": rank}
    try:
        load()
    except ValueError as exc:
        outcome.update(phase="load", type=type(exc).__name__, msg=str(exc))
        torch.save(outcome, f"{report}.{rank}")
        os._exit(3)   # the user's script stops here
    start = time.monotonic()
    try:
        for step in range(2):
            _step(model, optimizer, CONFIG, rank, step)
        outcome.update(phase="train", type=None)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        outcome.update(phase="train", type=type(exc).__name__, msg=str(exc),
                       is_value_error=isinstance(exc, ValueError))
    outcome["s"] = time.monotonic() - start
    torch.save(outcome, f"{report}.{rank}")
    return outcome


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ckpt"))
    spawn(_train_and_save_rank0_only, 2, directory, 3, timeout=300)
    return directory


def _outcomes(directory: str, plan: list, may_die=()) -> list[dict]:
    report = os.path.join(directory, "report_" + "_".join(str(p) for p in plan))
    spawn(_load_and_train, 2, directory, plan, report, timeout=180, may_die=may_die)
    return [torch.load(f"{report}.{rank}") for rank in range(2)]


@pytest.mark.distributed
def test_rank0_file_loaded_everywhere_is_refused_and_the_peer_fails_too(saved_run):
    """Rank 0's one file loaded on both ranks (the silent drift of the README's old quick
    start): rank 1 refuses another rank's residuals, saying how to save; rank 0, which loaded
    its own state, does not hang: its first step raises (the peer is gone)."""
    zero, one = _outcomes(saved_run, ["ckpt3.pt", "ckpt3.pt"], may_die=(1,))
    assert one["phase"] == "load" and one["type"] == "ValueError", one
    assert "rank 0" in one["msg"] and "rank 1" in one["msg"] and "one file per rank" in one["msg"], one["msg"]
    assert "torch.distributed.checkpoint" in one["msg"], one["msg"]
    assert zero["phase"] == "train" and zero["type"] is not None, zero
    assert zero["s"] < 20, zero   # the Comm timeout is 30 s: the closed connection is seen first


@pytest.mark.distributed
@pytest.mark.parametrize("plan", [["step3_rank0.pt", "step2_rank1.pt"], ["step3_rank0.pt", None],
                                  [None, "step3_rank1.pt"]], ids=["steps 3 and 2", "rank 1 fresh", "rank 0 fresh"])
def test_ranks_resumed_from_different_saves_raise_the_same_error(saved_run, plan):
    """Each rank loads a file of its own (so each load is accepted), but not of the same save:
    the first sparse bucket's handshake compares the saves' fingerprints; every rank raises the
    same ValueError naming the checkpoint, none hangs, none aborts."""
    zero, one = _outcomes(saved_run, plan)
    for outcome in (zero, one):
        assert outcome["phase"] == "train" and outcome["is_value_error"], outcome
        assert "checkpoint" in outcome["msg"] and "different checkpoints" in outcome["msg"], outcome["msg"]
    # the same fields and ranks on both (the first line names the rank and its own N: a fresh rank
    # meets DDP's initial buckets, a resumed one the saved layout's)
    assert zero["msg"].splitlines()[1:] == one["msg"].splitlines()[1:], (zero["msg"], one["msg"])


@pytest.mark.distributed
def test_per_rank_files_of_the_same_save_load_and_train(saved_run):
    """The control of the two tests above: each rank its own file of one save trains on."""
    zero, one = _outcomes(saved_run, ["step3_rank0.pt", "step3_rank1.pt"])
    assert zero["type"] is None and one["type"] is None, (zero, one)


# -- the functional reducer, in one process -------------------------------------------------

def _reducer_states(P: int, calls: int = 2):
    n = 5000

    def fn(comm):
        red = sc.SparseAllreduce("topka", 0.01, comm=comm)
        for step in range(calls):
            red(torch.randn(n, generator=torch.Generator().manual_seed(10 * comm.rank + step)))
        return red.state_dict()
    return simulate(P, fn).results


def test_reducer_state_records_rank_world_size_and_a_shared_fingerprint():
    states = _reducer_states(3)
    assert [s["rank"] for s in states] == [0, 1, 2] and {s["world_size"] for s in states} == {3}
    assert len({s["fingerprint"] for s in states}) == 1 and states[0]["fingerprint"] != 0
    later = _reducer_states(3, calls=3)
    assert later[0]["fingerprint"] != states[0]["fingerprint"]   # another step: another save


def test_reducer_refuses_another_ranks_state_and_another_world_size():
    states = _reducer_states(2)

    def load(comm, state):
        try:
            sc.SparseAllreduce("topka", 0.01, comm=comm).load_state_dict(state)
            return None
        except ValueError as exc:
            return str(exc)
    swapped = simulate(2, lambda comm: load(comm, states[1 - comm.rank])).results
    assert all("holds the state of rank" in msg and "one file per rank" in msg for msg in swapped), swapped
    own = simulate(2, lambda comm: load(comm, states[comm.rank])).results
    assert own == [None, None]
    grown = simulate(3, lambda comm: load(comm, states[min(comm.rank, 1)])).results
    assert all("saved by a run of 2 ranks; this run has 3" in msg for msg in grown), grown


def test_reducer_refuses_a_state_of_an_older_sparsecomm():
    state = _reducer_states(1)[0]
    old = {key: value for key, value in state.items()
           if key not in ("checkpoint_version", "rank", "world_size", "fingerprint")}
    old["format_version"] = 1   # what states carried before they recorded their rank

    def fn(comm):
        with pytest.raises(ValueError, match="older sparsecomm"):
            sc.SparseAllreduce("topka", 0.01, comm=comm).load_state_dict(old)
    simulate(1, fn)


def test_hook_state_refuses_another_ranks_residuals():
    """The hook's state names its rank; a state holding another rank's residuals is refused
    (in one process: a one-rank Comm, the residuals relabelled as rank 1's), its own accepted."""
    def fn(comm):
        state = sc.DDPHookState("topka", 0.05, comm=comm)
        packed = state.state_dict()
        assert set(packed) == {"sparsecomm", "checkpoint_version", "world_size", "fingerprint", "rank0"}
        assert packed["fingerprint"] == 0   # nothing seen yet: loading it is a fresh start
        sc.DDPHookState("topka", 0.05, comm=comm).load_state_dict(packed)
        local = state.local_state_dict()
        local.update(rank=1, residuals={0: torch.ones(3)}, fingerprint=12345)
        with pytest.raises(ValueError, match="holds the state of rank 1 .* this is rank 0"):
            sc.DDPHookState("topka", 0.05, comm=comm).load_state_dict(local)
        local.update(rank=0, world_size=2)
        with pytest.raises(ValueError, match="saved by a run of 2 ranks; this run has 1"):
            sc.DDPHookState("topka", 0.05, comm=comm).load_state_dict(local)
    simulate(1, fn)



@pytest.mark.parametrize("key", ["warmup_steps", "layout_final", "next_layout", "algorithm_states"])
def test_hook_state_without_a_key_of_its_version_is_refused(key):
    """Every key of a local_state_dict() is part of the checkpoint's version: a state lacking
    one is no state_dict() of this sparsecomm (no default is made up for it)."""
    def fn(comm):
        local = sc.DDPHookState("topka", 0.05, comm=comm).local_state_dict()
        del local[key]
        with pytest.raises(ValueError, match=rf"lacks the keys \['{key}'\]"):
            sc.DDPHookState("topka", 0.05, comm=comm).load_state_dict(local)
    simulate(1, fn)

def _dcp_save_after_two_steps(rank, world_size, path):
    from sparsecomm.comm.torch_comm import TorchComm

    model, state, optimizer = _build(CONFIG, "topka", {}, TorchComm(timeout=30), world_size)
    for step in range(2):
        _step(model, optimizer, CONFIG, rank, step)
    _save_dcp(path, model, optimizer, state, 2)


def _dcp_load(rank, world_size, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from sparsecomm.comm.torch_comm import TorchComm

    model, state, optimizer = _build(CONFIG, "topka", {}, TorchComm(timeout=30), world_size)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.load({"model": model_sd, "optim": optim_sd, "hook": state}, checkpoint_id=os.path.join(path, "dcp_step2"))
        return None
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.distributed
def test_a_world_size_change_through_dcp_is_refused_on_every_rank(tmp_path):
    """Saved by 3 ranks, loaded by 2: every rank finds its own part and refuses it (ValueError:
    not supported, what to do); saved by 2, loaded by 3: rank 2 has no part, and DCP's own
    planning error names the missing key on every rank. Never a silent resume."""
    three, two = str(tmp_path / "three"), str(tmp_path / "two")
    spawn(_dcp_save_after_two_steps, 3, three, timeout=300)
    shrunk = spawn(_dcp_load, 2, three, timeout=300)
    assert all(msg and msg.startswith("ValueError") and "saved by a run of 3 ranks; this run has 2" in msg
               for msg in shrunk), shrunk
    spawn(_dcp_save_after_two_steps, 2, two, timeout=300)
    grown = spawn(_dcp_load, 3, two, timeout=300)
    assert all(msg and msg.startswith("CheckpointException") for msg in grown), grown


def _load_rank0_file_with_the_default_comm(rank, world_size, directory, report):
    """The README's quick start: DDPHookState without comm= (its Comm is built at the first
    bucket, a collective of every rank), rank 0's one file loaded on both ranks."""
    model, state, optimizer = _build(CONFIG, "topka", {}, None, world_size)

    def load():
        state.load_state_dict(torch.load(os.path.join(directory, "ckpt3.pt"))["hook"])

    return _load_then_train_two_steps(rank, model, optimizer, load, report)


@pytest.mark.distributed
def test_rank0_file_loaded_everywhere_with_the_default_comm_fails_the_peer_quickly(saved_run):
    """As above, but with the Comm the state builds itself at its first bucket (no comm=):
    rank 1 refuses at load_state_dict, before any Comm exists, so rank 0 would wait in the
    Comm's construction (a collective) for the process group's timeout. The refusing rank
    joins that construction and aborts the Comm, so rank 0 raises within seconds."""
    report = os.path.join(saved_run, "report_default_comm")
    spawn(_load_rank0_file_with_the_default_comm, 2, saved_run, report, timeout=60, may_die=(1,))
    zero, one = (torch.load(f"{report}.{rank}") for rank in range(2))
    assert one["phase"] == "load" and one["type"] == "ValueError" and "rank 0" in one["msg"], one
    assert zero["phase"] == "train" and zero["type"] is not None, zero
    assert zero["s"] < 20, zero
