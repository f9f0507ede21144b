"""sparsecomm.register (one call for DDP models and the bare modules of 1-process runs) and
DDPHookState.gathered_state_dict (every rank's part in the one file rank 0 writes)."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsecomm as sc
import sparsecomm.hook as hook_module
from sparsecomm.reduce.checkpoint import gather_rank_parts, pack_rank_part
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

STEPS, SAVE_AT = 5, 3


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def _train(rank, world_size, path, resume):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_net(), bucket_cap_mb=0.005)
    state = sc.register(model, sc.DDPHookState("topka", 0.05))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start, reduced, parts = 0, [], None
    if resume:   # every rank reads the one file rank 0 wrote, as Lightning and Accelerate do
        ckpt = torch.load(path, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        state.load_state_dict(ckpt["hook"])
        start = SAVE_AT
    for step in range(start, STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        reduced.append(sum(s["nnz_out"] > 0 for s in state.last_stats.values()))
        if not resume and step + 1 == SAVE_AT:
            hook = state.gathered_state_dict()
            parts = sorted(k for k in hook if k.startswith("rank"))
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "hook": hook}, path)
    state.close()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), reduced, parts, state.step


def test_register_then_the_rank0_file_resumes_every_rank_bit_identically(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    first = spawn(_train, 2, path, False, timeout=180)
    # the hook reduced every bucket of every step, on both ranks
    assert all(r[3] == STEPS and len(r[1]) == STEPS and min(r[1]) >= 1 for r in first)
    assert first[0][2] == ["rank0", "rank1"] and first[1][2] == ["rank1"]
    second = spawn(_train, 2, path, True, timeout=180)
    for rank in range(2):
        assert torch.equal(first[rank][0], second[rank][0]), f"rank {rank} drifted after resume"
    assert torch.equal(first[0][0], first[1][0])


def _bare_module_with_two_ranks(rank, world_size):
    try:
        sc.register(_net(), sc.DDPHookState("topka", 0.05))
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_a_bare_module_while_several_ranks_run_is_refused():
    out = spawn(_bare_module_with_two_ranks, 2, timeout=60)
    assert all("bare Sequential but 2 ranks are running" in o and "DistributedDataParallel(model)" in o for o in out)


def test_a_bare_module_of_a_one_process_run_is_left_alone_and_said_once(monkeypatch):
    monkeypatch.setattr(hook_module, "_told_one_process", False)
    model, state = _net(), sc.DDPHookState("topka", 0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sc.register(model, state) is state
        assert sc.register(_net(), sc.DDPHookState("dense", 0.05)) is not None
    said = [w for w in caught if "1-process run: there is nothing to reduce" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    # a 1-process state saves and loads like any other
    sc.DDPHookState("topka", 0.05).load_state_dict(state.gathered_state_dict())


def _one_rank_group(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.compile(DDP(_net()))    # the compiled wrapper's module gets the hook
    state = sc.register(model, sc.DDPHookState("topka", 0.5))
    x, y = _batch(0, 0)
    torch.nn.functional.cross_entropy(model._orig_mod(x), y).backward()
    state.close()
    return state.step


def _ddp_on_a_group_of_its_own(rank, world_size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dist.new_group(list(range(world_size)))
    model = DDP(_net(), process_group=group)
    state = sc.register(model, sc.DDPHookState("topka", 0.05))
    x, y = _batch(rank, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    adopted = state.process_group is group
    state.close()
    return adopted, state.step


def test_the_hook_reduces_over_the_group_ddp_was_given():
    assert spawn(_ddp_on_a_group_of_its_own, 2, timeout=120) == [(True, 1), (True, 1)]


def test_a_compiled_ddp_model_of_one_rank_gets_the_hook():
    assert spawn(_one_rank_group, 1, timeout=120) == [1]


@pytest.mark.parametrize("model,state,message", [
    (torch.nn.Linear(2, 2), "topka", "state must be a sparsecomm.DDPHookState, got str"),
    ("model", None, "model must be a torch.nn.Module wrapped in DistributedDataParallel, got str"),
])
def test_what_is_not_a_model_or_a_state_is_refused(model, state, message):
    with pytest.raises(TypeError, match=message):
        sc.register(model, sc.DDPHookState("topka", 0.1) if state is None else state)


def test_the_gather_refuses_ranks_of_different_saves_on_every_rank():
    def fn(comm):
        local = {"rank": comm.rank, "world_size": 2, "fingerprint": 7 + comm.rank, "step": comm.rank}
        try:
            gather_rank_parts("DDPHookState", pack_rank_part("DDPHookState", local), comm)
        except ValueError as exc:
            return str(exc)
        return "gathered"

    out = simulate(2, fn).results
    assert out[0] == out[1] and "ranks [1] differ from rank 0" in out[0]


def test_the_gather_moves_bytes_rank0_never_decodes():
    def fn(comm):
        packed = {"sparsecomm": "DDPHookState", "checkpoint_version": 1, "world_size": 3, "fingerprint": 5,
                  f"rank{comm.rank}": bytes([comm.rank]) * (10 + comm.rank)}   # not torch.save bytes
        return gather_rank_parts("DDPHookState", packed, comm)

    out = simulate(3, fn).results
    assert {k: v for k, v in out[0].items() if k.startswith("rank")} == \
        {f"rank{r}": bytes([r]) * (10 + r) for r in range(3)}
    assert sorted(out[2]) == ["checkpoint_version", "fingerprint", "rank2", "sparsecomm", "world_size"]


def _load_rank0_file(rank, world_size, path):
    """Resume from the one file rank 0 wrote (Lightning's and Accelerate's way) with the state's
    own Comm (built at its first bucket): (error type, message, seconds until it was raised)."""
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_net(), bucket_cap_mb=0.005)
    state = sc.register(model, sc.DDPHookState("topka", 0.05))
    start = time.perf_counter()
    try:
        state.load_state_dict(torch.load(path, weights_only=True)["hook"])
        x, y = _batch(rank, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        return None, "", time.perf_counter() - start
    except Exception as exc:   # each rank's own error, compared below
        return type(exc).__name__, str(exc), time.perf_counter() - start
    finally:
        state.close()


@pytest.mark.distributed
def test_a_world_size_change_on_resume_is_the_same_error_on_every_rank(tmp_path):
    """Saved by 2 ranks into rank 0's one file, resumed by 3 (and saved by 3, resumed by 2): every
    rank raises the ValueError that names the world-size change, within seconds. Before, the rank
    added since found no part of its own and raised "save one file per rank" alone, and the
    others waited for it in the Comm's construction for the process group's timeout (30 min)."""
    for saved, resumed in ((2, 3), (3, 2)):
        path = str(tmp_path / f"ckpt{saved}.pt")
        spawn(_train, saved, path, False, timeout=180)
        outs = spawn(_load_rank0_file, resumed, path, timeout=120)
        for rank, (kind, msg, seconds) in enumerate(outs):
            assert kind == "ValueError" and f"saved by a run of {saved} ranks; this run has {resumed}" in msg, \
                (saved, resumed, rank, kind, msg)
            assert seconds < 30, (saved, resumed, rank, seconds)
