"""SparseAllreduce: argument checks, rank mismatch detection, state, shapes, k rule."""

from __future__ import annotations

import re

import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate

from _reference import ref_k, ref_topk_indices


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), "0.1", True, None])
def test_bad_density_raises(density):
    with pytest.raises(ValueError, match="density"):
        sc.SparseAllreduce("topka", density, comm=simulate(1, lambda c: c).results[0])


def test_unknown_algorithm_and_option_raise():
    comm = simulate(1, lambda c: c).results[0]
    with pytest.raises(ValueError, match="unknown algorithm 'sparse'"):
        sc.SparseAllreduce("sparse", 0.1, comm=comm)
    with pytest.raises(ValueError, match="does not take option.*teams"):
        sc.SparseAllreduce("topka", 0.1, comm=comm, teams=2)


K_RULE_TABLE = [  # (density, N, k) worked out by hand from k = max(1, ceil(density * N)), at most N
    (0.5, 0, 0),          # N = 0: nothing to select
    (0.001, 1, 1),        # N = 1, tiny density: the one element
    (1.0, 1, 1),
    (1.0, 5, 5),          # density 1.0: every element
    (0.999, 5, 5),        # 4.995 -> 5
    (0.25, 8, 2),         # exact product
    (0.5, 3, 2),          # 1.5 -> 2
    (0.3, 7, 3),          # 2.1 -> 3
    (0.01, 1025, 11),     # 10.25 -> 11
    (0.001, 1000, 1),     # exactly 1
    (0.001, 10, 1),       # 0.01 -> at least 1
    (1e-9, 3, 1),         # tiny density -> 1
    (0.002, 2**20 + 3, 2098),   # 2097.158 -> 2098
]


@pytest.mark.parametrize("density,n,k", K_RULE_TABLE)
def test_k_rule_table(density, n, k):
    assert sc.k_for(density, n) == k
    assert sc.SparseAllreduce("topka", density, comm=simulate(1, lambda c: c).results[0]).k_for(n) == k


# the float products overshoot (0.07 * 100 = 7.000000000000001): k must still be 7
@pytest.mark.parametrize("density,n,k", [(0.07, 100, 7), (0.14, 100, 14), (0.55, 100, 55), (0.29, 100, 29),
                                         (0.001, 15_000_000, 15_000), (1 / 3, 3, 1)])
def test_k_rule_decimal_density_whose_float_product_overshoots(density, n, k):
    assert sc.k_for(density, n) == k


@pytest.mark.parametrize("field,tweak,expected_line", [
    ("N", lambda rank: {"n": 100 + (rank == 2)}, r"N: ranks \[0, 1, 3\] have 100; ranks \[2\] have 101"),
    ("dtype", lambda rank: {"dtype": torch.float64 if rank == 1 else torch.float32},
     r"dtype: ranks \[0, 2, 3\] have torch\.float32; ranks \[1\] have torch\.float64"),
    ("algorithm", lambda rank: {"algorithm": "dense" if rank == 0 else "topka"},
     r"algorithm: ranks \[0\] have 'dense'; ranks \[1, 2, 3\] have 'topka'"),
    # options in words: the algorithm's options and nonfinite, sorted key=value
    ("options", lambda rank: {"options": {"nonfinite": "raise"} if rank == 3 else {}},
     # topka's options are its COO codec options (formats/codec.py), sorted with nonfinite
     r"options: ranks \[0, 1, 2\] have \{index_codec='none', m='auto', nonfinite='propagate', prefix='auto', "
     r"q=256, r=8, s=2, t=0\.2, value_codec='none'\}; ranks \[3\] have \{index_codec='none', m='auto', "
     r"nonfinite='raise', prefix='auto', q=256, r=8, s=2, t=0\.2, value_codec='none'\}"),
    ("options", lambda rank: {"algorithm": "spardl", "options": {"sag": "recursive"} if rank == 1 else {}},
     r"options: ranks \[0, 2, 3\] have \{index_codec='none', m='auto', nonfinite='propagate', prefix='auto', "
     r"q=256, r=8, s=2, sag='auto', t=0\.2, teams=None, value_codec='none'\}; "
     r"ranks \[1\] have \{index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, "
     r"sag='recursive', t=0\.2, teams=None, value_codec='none'\}"),
    ("options", lambda rank: {"algorithm": "gssgd", "options": {"rows": 7, "heavymix": "random"} if rank == 0 else {}},
     r"options: ranks \[0\] have \{allreduce='scatter', columns=None, estimate='sliced', heavymix='random', nonfinite='propagate', "
     r"p1=1\.0, p2=8\.0, rows=7, seed=24301, sketch_size=None\}; "
     r"ranks \[1, 2, 3\] have \{allreduce='scatter', columns=None, estimate='sliced', heavymix='topk', nonfinite='propagate', "
     r"p1=1\.0, p2=8\.0, rows=5, seed=24301, sketch_size=None\}"),
    ("density", lambda rank: {"density": 0.1 if rank == 3 else 0.2},
     r"density: ranks \[0, 1, 2\] have 0\.2; ranks \[3\] have 0\.1"),
])
def test_rank_mismatch_raises_on_every_rank(field, tweak, expected_line):
    def fn(comm):
        setup = {"n": 100, "dtype": torch.float32, "algorithm": "topka", "density": 0.2, "options": {},
                 **tweak(comm.rank)}
        reducer = sc.SparseAllreduce(setup["algorithm"], setup["density"], comm=comm, **setup["options"])
        try:
            reducer(torch.ones(setup["n"], dtype=setup["dtype"]))
        except ValueError as exc:
            return str(exc)
        return None

    messages = simulate(4, fn).results
    assert all(m is not None for m in messages), messages
    for rank, message in enumerate(messages):
        assert message.startswith(f"rank {rank}: the ranks disagree"), message
        # the field's own line names the ranks on each side and their values
        assert any(re.fullmatch(expected_line, line.strip()) for line in message.splitlines()), (field, message)
    # every rank names the same disagreement (the first line says which rank is speaking)
    assert len({m.split("\n", 1)[1] for m in messages}) == 1


def test_builds_with_another_wire_revision_refuse_on_every_rank():
    """A rank whose build hashes sketches differently (wire_revision) is caught by the handshake."""
    from sparsecomm.algorithms.gssgd import GlobalSketchSGD

    class OtherHashFamily(GlobalSketchSGD):
        wire_revision = "sketch-per-coordinate"

    def fn(comm):
        reducer = sc.SparseAllreduce("gssgd", 0.1, comm=comm)
        if comm.rank == 1:
            reducer.algorithm.__class__ = OtherHashFamily
        try:
            reducer(torch.ones(1000))
        except ValueError as exc:
            return str(exc)
        return None

    messages = simulate(3, fn).results
    expected = r"algorithm: ranks \[0, 2\] have 'gssgd/sketch-runs16/hh-width'; ranks \[1\] have 'gssgd/sketch-per-coordinate'"
    assert all(m is not None and any(re.fullmatch(expected, line.strip()) for line in m.splitlines())
               for m in messages), messages


def test_ranks_resumed_from_different_checkpoints_refuse_on_every_rank():
    """A reducer's checkpoint fingerprint (0: a fresh start) is part of the first call's
    handshake: ranks that loaded different saves, or only some of them, raise the same
    error on every rank naming the ranks on each side, instead of silently drifting."""
    ids = {0: 0, 1: 0x5EED_0123_4567_89AB, 2: 0x5EED_0123_4567_89AB, 3: 0x1234}

    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.2, comm=comm)
        reducer._checkpoint_id = ids[comm.rank]
        try:
            reducer(torch.ones(100))
        except ValueError as exc:
            return str(exc)
        return None

    messages = simulate(4, fn).results
    expected = (r"checkpoint: ranks \[0\] have a fresh start; ranks \[1, 2\] have checkpoint #5eed0123456789ab; "
                r"ranks \[3\] have checkpoint #1234")
    for message in messages:
        assert message is not None and any(re.fullmatch(expected, line.strip()) for line in message.splitlines()), \
            messages
        assert "load its own state from the same save" in message
    assert len({m.split("\n", 1)[1] for m in messages}) == 1

    def same(comm):   # the same fingerprint everywhere: no error
        reducer = sc.SparseAllreduce("topka", 0.2, comm=comm)
        reducer._checkpoint_id = 0x5EED
        return float(reducer(torch.ones(100)).sum())

    assert simulate(2, same).results == [40.0, 40.0]


def test_shape_dtype_and_out_are_kept():
    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.25, comm=comm)
        grad = torch.arange(12, dtype=torch.float16).reshape(3, 4) * (comm.rank + 1)
        out = torch.empty_like(grad)
        returned = reducer(grad, out=out)
        return returned is out, out.clone(), reducer.residual.clone(), reducer.last_stats

    results = simulate(2, fn).results
    same_object, out, residual, stats = results[0]
    assert same_object and out.shape == (3, 4) and out.dtype == torch.float16
    assert residual.dtype == torch.float32 and residual.shape == (3, 4)
    # top-3 of each rank are the last three entries: 9, 10, 11 times (rank + 1)
    expected = torch.zeros(12)
    expected[9:] = torch.tensor([9.0, 10.0, 11.0]) * 3
    assert torch.equal(out.reshape(-1).float(), expected)
    assert stats["nnz_out"] == 3 and stats["k"] == 3


def test_reuse_for_other_size_raises_on_every_rank_and_reset_allows_it():
    """Reusing a reducer for another N is found by the call's agreement record: when one rank
    does it, every rank raises the same ValueError naming the ranks, N and k on each side
    (nothing is aborted: the Comm stays usable, and the reducers go on once every rank
    resets); when every rank does it, every rank raises the reuse error."""

    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.5, comm=comm)
        reducer(torch.ones(8))
        with pytest.raises(ValueError) as one:
            reducer(torch.ones(9 if comm.rank == 1 else 8))
        with pytest.raises(ValueError) as every:
            reducer(torch.ones(9))
        reducer.reset()
        return str(one.value), str(every.value), reducer(torch.ones(9)).sum().item()

    results = simulate(2, fn).results
    for rank, (one, every, total) in enumerate(results):
        assert one.startswith(f"rank {rank}: the ranks disagree"), one
        lines = [line.strip() for line in one.splitlines()]
        assert "kind: ranks [0] have a later call; ranks [1] have a call with another tensor, without reset()" \
            in lines, one
        assert "N: ranks [0] have 8; ranks [1] have 9" in lines and "k: ranks [0] have 4; ranks [1] have 5" in lines
        assert "reset() on every rank before giving it another" in one
        assert every == (f"rank {rank}: this reducer was used for N=8 (torch.float32, cpu) and now gets N=9 "
                         "(torch.float32, cpu) on every rank: use one SparseAllreduce per tensor, or call reset() "
                         "on every rank first")
        assert total == 10.0   # k = 5 ones per rank, both ranks
    assert results[0][0].split("\n", 1)[1] == results[1][0].split("\n", 1)[1]

    def alone(comm):
        reducer = sc.SparseAllreduce("topka", 0.5, comm=comm)
        reducer(torch.ones(8))
        with pytest.raises(ValueError, match="one SparseAllreduce per tensor"):
            reducer(torch.ones(9))
        reducer.reset()
        return reducer(torch.ones(9)).sum().item()

    assert simulate(1, alone).results == [5.0]


def test_state_dict_round_trip_continues_the_residual():
    n, density, steps = 257, 0.05, 4
    grads = [[torch.randn(n, generator=torch.Generator().manual_seed(10 * s + r)) for r in range(3)]
             for s in range(steps)]

    def uninterrupted(comm):
        reducer = sc.SparseAllreduce("topka", density, comm=comm)
        return [reducer(grads[s][comm.rank]) for s in range(steps)]

    def resumed(comm):
        reducer = sc.SparseAllreduce("topka", density, comm=comm)
        outs = [reducer(grads[s][comm.rank]) for s in range(2)]
        saved = reducer.state_dict()
        fresh = sc.SparseAllreduce("topka", density, comm=comm)
        fresh.load_state_dict(saved)
        return outs + [fresh(grads[s][comm.rank]) for s in range(2, steps)]

    a, b = simulate(3, uninterrupted).results, simulate(3, resumed).results
    for rank in range(3):
        for s in range(steps):
            assert torch.equal(a[rank][s], b[rank][s]), (rank, s)
    comm = simulate(1, lambda c: c).results[0]
    with pytest.raises(ValueError, match="algorithm 'topka'"):
        sc.SparseAllreduce("dense", density, comm=comm).load_state_dict(
            sc.SparseAllreduce("topka", density, comm=comm).state_dict())


def test_topk_selection_follows_magnitude_with_low_index_ties():
    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.5, comm=comm)
        return reducer(torch.tensor([1.0, -3.0, 3.0, -1.0, 2.0, -2.0]))

    out = simulate(1, fn).results[0]
    grad = torch.tensor([1.0, -3.0, 3.0, -1.0, 2.0, -2.0])
    expected = torch.zeros(6)
    keep = ref_topk_indices(grad, ref_k(0.5, 6))
    expected[keep] = grad[keep]
    assert torch.equal(out, expected)


def test_nan_gradient_is_never_dropped():
    """nonfinite="raise" raises naming the rank; the default "propagate" hands the NaN back
    (the dense sum of the raw gradient) and leaves the residual as it was.
    Every algorithm and P: tests/test_nonfinite.py."""
    def fn(comm):
        grad = torch.tensor([1.0, float("nan"), 2.0, 3.0])
        with pytest.raises(ValueError, match=r"non-finite gradient on ranks \[0\] \(ranks \[0\] have NaN"):
            sc.SparseAllreduce("topka", 0.5, comm=comm, nonfinite="raise")(grad)
        reducer = sc.SparseAllreduce("topka", 0.5, comm=comm)
        reducer(torch.tensor([0.0, 3.0, 4.0, 1.0]))  # k = 2: residual [0, 0, 0, 1]
        out = reducer(grad)
        return out, reducer.residual, reducer.last_stats["nonfinite_ranks"]

    out, residual, ranks = simulate(1, fn).results[0]
    assert torch.equal(out.isnan(), torch.tensor([False, True, False, False]))
    assert torch.equal(out[[0, 2, 3]], torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(residual, torch.tensor([0.0, 0.0, 0.0, 1.0])) and ranks == [0]


def test_nonfinite_policy_is_validated():
    with pytest.raises(ValueError, match="nonfinite must be one of 'propagate', 'raise'"):
        sc.SparseAllreduce("topka", 0.5, nonfinite="ignore")  # refused before any Comm is made
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        sc.DDPHookState("topka", 0.5, nonfinite=True)



def test_set_checkpoint_fingerprint_is_compared_by_the_first_call():
    """A reducer told which save it continues from (as the DDP hook tells the reducers of a
    loaded state) carries that fingerprint in its handshake: ranks told different saves raise
    the same error naming both; the same save everywhere reduces as usual."""
    def differ(comm):
        reducer = sc.SparseAllreduce("topka", 0.2, comm=comm)
        reducer.set_checkpoint_fingerprint([0x1234, 0x5678][comm.rank])
        with pytest.raises(ValueError) as caught:
            reducer(torch.ones(100))
        return str(caught.value)

    expected = "checkpoint: ranks [0] have checkpoint #1234; ranks [1] have checkpoint #5678"
    messages = simulate(2, differ).results
    assert all(expected in message for message in messages), messages

    def same(comm):
        reducer = sc.SparseAllreduce("topka", 0.2, comm=comm)
        reducer.set_checkpoint_fingerprint(0x1234)
        return float(reducer(torch.ones(100)).sum())

    assert simulate(2, same).results == [40.0, 40.0]


@pytest.mark.parametrize("mark", [-1, 1 << 63, 1.0, "1234", None])
def test_set_checkpoint_fingerprint_refuses_what_no_save_has(mark):
    reducer = sc.SparseAllreduce("topka", 0.2, comm=simulate(1, lambda c: c).results[0])
    with pytest.raises(ValueError, match="fingerprint must be an int in"):
        reducer.set_checkpoint_fingerprint(mark)


def test_a_bad_argument_on_one_rank_leaves_its_comm_usable():
    """With no peer waiting, an argument error aborts nothing: the rank raises its ValueError and
    its next call, with a good gradient, reduces (the sum of one rank is its own top-k)."""
    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.5, comm=comm)
        with pytest.raises(ValueError, match="floating-point"):
            reducer(torch.ones(4, dtype=torch.int64))
        return reducer(torch.tensor([1.0, -4.0, 3.0, 0.5]))
    assert simulate(1, fn).results[0].tolist() == [0.0, -4.0, 3.0, 0.0]


def test_importing_sparsecomm_leaves_dynamo_unimported():
    """torch._dynamo costs 2-3 s of CPU to import; every rank of a launch imports sparsecomm, so
    sparsecomm must not pull it in where nothing compiles."""
    import subprocess
    import sys

    code = ("import sys, torch, torch.distributed, sparsecomm, sparsecomm.hooks, sparsecomm.integrations; "
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:3])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_call_inside_torch_compile_runs_eagerly_with_the_same_result():
    """Under torch.compile the reducer's call is a graph break (its communication cannot be
    traced): a compiled function around it gives the eager result, call after call, residual
    included."""
    torch.manual_seed(0)
    eager = sc.SparseAllreduce("topka", 0.25, comm=simulate(1, lambda c: c).results[0])
    inside = sc.SparseAllreduce("topka", 0.25, comm=simulate(1, lambda c: c).results[0])
    compiled = torch.compile(lambda g: inside(g) * 2 + 1, backend="eager")
    for step in range(3):
        g = torch.randn(64, generator=torch.Generator().manual_seed(step))
        assert torch.equal(compiled(g), eager(g) * 2 + 1), step
    assert inside.last_stats["k"] == 16
