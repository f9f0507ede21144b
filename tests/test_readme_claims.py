"""One test (or one table of cases) per claim of README.md's "Behaviour you can rely on".

Each test is named after its claim and checks it for every registered algorithm
(``sparsecomm.algorithms.names()``) against a reference written here. Claims that a
per-algorithm file already checks in more depth name that file too:

=====================================================================  ==========================================
claim                                                                  tests
=====================================================================  ==========================================
k = max(1, ceil(density * N)) per rank and tensor                      test_k_per_rank_and_tensor_is_the_table_k,
                                                                       test_reducer.py::test_k_rule_table
the result is bit-identical on every rank                              test_result_is_bit_identical_on_every_rank
                                                                       (and every algorithm's gloo test, P = 1..8)
error feedback loses nothing (P = 1..8 gloo, up to 64 simulated,       test_error_feedback_loses_nothing,
N = 0, 1, 2, 1025, 2^20+3, zeros, ties, k >= N)                        test_algorithms.py, test_spardl.py,
                                                                       test_sparcml.py, test_gtopk.py,
                                                                       test_gssgd.py (gloo P = 1..8 each),
                                                                       test_oktopk.py (gloo P = 1..6)
ranks that disagree (N, dtype, algorithm, options, density, version)   test_disagreeing_ranks_raise_the_same_value_error,
raise the same ValueError naming the ranks and the field               test_reducer.py::test_rank_mismatch_raises_on_every_rank
a peer that does not answer raises CommTimeoutError within the         test_silent_peer_raises_comm_timeout_simulated,
Comm's timeout                                                         test_silent_peer_raises_comm_timeout_on_gloo,
                                                                       test_comm_torch.py::test_timeout_names_pending_peer
NaN/Inf: one policy (nonfinite); "propagate" gives every rank the    test_nonfinite_gradients_follow_one_policy,
dense sum of the raw gradients, residuals unchanged (GradScaler         test_nonfinite.py (P = 2, 3, 4 simulated,
skips); "raise" raises the same ValueError on every rank                gloo, GradScaler on DDP)
float16/bfloat16 reduced in float32 and rounded once; the hook          test_half_gradients_reduced_in_float32_rounded_once,
divides by P in float32 before rounding                                test_ops.py::test_merge_half_rounded_once,
                                                                       test_half_precision.py
messages are uint8 tensors in documented layouts                       test_messages_are_uint8_in_documented_layouts
nothing a peer sends is unpickled                                      test_nothing_a_peer_sends_is_unpickled
ranks fail together: an error on one rank raises on every rank         test_fail_together.py (local error,
naming it within 2 s; a killed peer is a CommError, a stopped one      argument error and reorder on gloo,
a CommTimeoutError; own process group and per-call tags                mpirun and simulated; SIGKILL and SIGSTOP;
(find_unused_parameters)                                               find_unused_parameters), test_comm_mpi.py
close() of a Comm, a hook state, a reducer releases what it took       test_fault_suite.py (rebuild loops: TorchComm,
                                                                       DDPHookState, two-level SparseAllreduce),
                                                                       test_comm_mpi.py (MPIComm)
a hook checkpoint resumes bit-identically in fresh processes           test_resume.py (every algorithm x 10 DDP
                                                                       configurations x P = 2, 3; warm-up;
                                                                       density schedule; auto's default trials),
(per-rank files or DCP); another rank's state, another world size,     test_checkpoint.py (per-rank files and DCP;
different saves on different ranks are refused on every rank           rank 0's file everywhere, mixed saves,
                                                                       world size, versions)
"Measured": the time-to-accuracy tables are the committed runs'       test_readme_time_to_accuracy_tables_are_the_committed_runs
=====================================================================  ==========================================
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.comm.base import CommError, CommTimeoutError
from sparsecomm.testing import spawn

ALGORITHMS = sc.algorithms.names()
#: the algorithms that pick entries by magnitude (every one but the dense baseline)
SELECTING = [name for name in ALGORITHMS if name != "dense"]
#: algorithms in which every rank lets through exactly its own k largest entries
OWN_TOP_K = ["topka", "sparcml_recursive_double", "sparcml_split_allgather", "sparcml", "topkdsa", "densestream",
             "zen"]


def test_the_algorithm_lists_cover_the_registry():
    """The tables below are written by hand; a new algorithm must be placed in them."""
    assert set(ALGORITHMS) == {"dense", "topka", "spardl", "sparcml", "sparcml_recursive_double",
                               "sparcml_split_allgather", "topkdsa", "gtopk", "gssgd", "oktopk", "densestream",
                               "skcompress", "zen", "auto"}


def _grad(n: int, rank: int, step: int, pattern: str = "random", dtype=torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    if pattern == "zeros":
        return torch.zeros(n, dtype=dtype)
    if pattern == "ties":
        return torch.randint(-1, 2, (n,), generator=gen).to(dtype)
    return torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)


# -- k = max(1, ceil(density * N)) per rank and tensor --------------------------------------
K_TABLE = [  # (density, N, k) by hand
    (0.01, 1000, 10),
    (0.0105, 1000, 11),     # 10.5 rounds up
    (0.001, 999, 1),        # 0.999 rounds up to 1
    (1e-9, 1000, 1),        # tiny density: at least one
    (1.0, 37, 37),          # density 1: everything
    (0.5, 1, 1),
]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_k_per_rank_and_tensor_is_the_table_k(algorithm):
    """The k each call reports is the table's k for that tensor; in the algorithms where each
    rank sends its own top-k, exactly k entries leave each rank's residual (nonzero input)."""
    def fn(comm):
        seen = []
        for density, n, _ in K_TABLE:
            reducer = sc.SparseAllreduce(algorithm, density, comm=comm)
            grad = torch.arange(1, n + 1, dtype=torch.float64) * (1 + comm.rank)  # distinct, nonzero
            reducer(grad)
            seen.append((reducer.last_stats["k"], int((reducer.residual == 0).sum())))
        return seen

    results = simulate(3, fn).results
    for rank, seen in enumerate(results):
        for (density, n, k), (reported_k, left) in zip(K_TABLE, seen):
            assert reported_k == k, (algorithm, density, n, reported_k, k)
            if algorithm in OWN_TOP_K or algorithm == "gssgd":
                assert left == k, (algorithm, rank, density, n, left, k)
            elif algorithm == "dense":
                assert left == n, (algorithm, rank, density, n, left)


# -- bit-identical on every rank, and error feedback loses nothing --------------------------
CONSERVATION_CASES = [  # (P, N, density, pattern, steps)
    (1, 1025, 0.01, "random", 3),
    (2, 0, 0.01, "random", 2),
    (3, 1, 0.01, "random", 3),
    (5, 2, 0.5, "random", 3),
    (4, 1025, 1.0, "random", 3),        # k >= N
    (3, 1025, 0.01, "zeros", 3),
    (5, 1025, 0.02, "ties", 3),
    (8, 1025, 0.01, "random", 4),
    (64, 1025, 0.01, "random", 2),
    (4, 2**20 + 3, 0.001, "random", 2),
]


def _history(algorithm, density, n, pattern, steps):
    def fn(comm):
        reducer = sc.SparseAllreduce(algorithm, density, comm=comm)
        hist = []
        for step in range(steps):
            grad = _grad(n, comm.rank, step, pattern)
            hist.append((grad, reducer(grad.clone()), reducer.residual.clone()))
        return hist
    return fn


@pytest.mark.parametrize("size,n,density,pattern,steps", CONSERVATION_CASES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_error_feedback_loses_nothing(algorithm, size, n, density, pattern, steps):
    """sum_r (g_r + e_r) == out + sum_r e'_r at every step, with e_r carried by the test."""
    results = simulate(size, _history(algorithm, density, n, pattern, steps)).results
    carried = [torch.zeros(n, dtype=torch.float64) for _ in range(size)]
    for step in range(steps):
        total_in = sum(results[r][step][0] + carried[r] for r in range(size))
        out = results[0][step][1]
        residuals = [results[r][step][2] for r in range(size)]
        scale = max(1.0, float(total_in.abs().max()) if n else 1.0)
        np.testing.assert_allclose((out + sum(residuals)).numpy(), total_in.numpy(), rtol=0, atol=1e-12 * scale * size,
                                   err_msg=f"{algorithm} P={size} N={n} {pattern} step {step}")
        carried = residuals
    if pattern == "zeros":
        assert all(not results[r][s][1].any() for r in range(size) for s in range(steps))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_result_is_bit_identical_on_every_rank(algorithm):
    for size, n, density, pattern in [(5, 1025, 0.01, "random"), (6, 4097, 0.02, "ties"), (3, 1025, 0.5, "random")]:
        results = simulate(size, _history(algorithm, density, n, pattern, 3)).results
        for step in range(3):
            first = results[0][step][1]
            for rank in range(1, size):
                assert torch.equal(results[rank][step][1].view(torch.uint8), first.view(torch.uint8)), \
                    (algorithm, size, n, step, rank)


# -- ranks that disagree raise the same ValueError -------------------------------------------
OTHER_VERSION = "0.0.9+other-build"
MISMATCH_CASES = [  # (field named in the error, rank -> (algorithm, density, N, dtype, options), ranks named)
    ("N", lambda r: ("topka", 0.1, 100 + (r == 2), torch.float32, {}), "ranks [2]"),
    ("dtype", lambda r: ("topka", 0.1, 100, torch.float64 if r == 1 else torch.float32, {}), "ranks [1]"),
    ("algorithm", lambda r: ("dense" if r == 0 else "topka", 0.1, 100, torch.float32, {}), "ranks [0]"),
    ("density", lambda r: ("topka", 0.2 if r == 1 else 0.1, 100, torch.float32, {}), "ranks [1]"),
    ("options", lambda r: ("spardl", 0.1, 300, torch.float32, {"sag": "bruck" if r == 0 else "recursive"}),
     "ranks [0]"),
    ("options", lambda r: ("topkdsa", 0.1, 300, torch.float32, {"quantize_bits": 8} if r == 2 else {}), "ranks [2]"),
    ("options", lambda r: ("gssgd", 0.1, 300, torch.float32, {"rows": 5 if r == 1 else 7}), "ranks [1]"),
    ("sparsecomm version", lambda r: ("topka", 0.1, 100, torch.float32, {}), "ranks [1]"),
]


def _mismatch_rank(rank, world_size):
    from sparsecomm.comm import TorchComm

    from sparsecomm import _version

    comm = TorchComm()
    real_version = _version.__version__
    messages = []
    for field, setup, _ in MISMATCH_CASES:
        algorithm, density, n, dtype, options = setup(rank)
        _version.__version__ = OTHER_VERSION if field == "sparsecomm version" and rank == 1 else real_version
        try:
            sc.SparseAllreduce(algorithm, density, comm=comm, **options)(torch.ones(n, dtype=dtype))
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
        finally:
            _version.__version__ = real_version
    # the group still works after every refusal
    after = sc.SparseAllreduce("topka", 1.0, comm=comm)(torch.full((4,), float(rank)))
    return messages, after.tolist()


@pytest.mark.distributed
def test_disagreeing_ranks_raise_the_same_value_error():
    size = 3
    runs = spawn(_mismatch_rank, size, timeout=120)
    for case, (field, _, ranks_named) in enumerate(MISMATCH_CASES):
        messages = [runs[rank][0][case] for rank in range(size)]
        assert all(m is not None for m in messages), (field, messages)
        for rank, message in enumerate(messages):
            assert message.startswith(f"rank {rank}: the ranks disagree"), message
            lines = [line.strip() for line in message.splitlines()]
            named = [line for line in lines if line.startswith(f"{field}: ")]
            assert len(named) == 1 and f"{ranks_named} have" in named[0], (field, message)
        # the same disagreement on every rank (the first line says which rank is speaking)
        assert len({m.split("\n", 1)[1] for m in messages}) == 1, messages
    version_line = next(line.strip() for line in runs[0][0][-1].splitlines()
                        if line.strip().startswith("sparsecomm version: "))
    assert version_line == (f"sparsecomm version: ranks [0, 2] have {sc.__version__!r}; "
                            f"ranks [1] have {OTHER_VERSION!r}"), version_line
    assert all(runs[rank][1] == [0.0 + 1.0 + 2.0] * 4 for rank in range(size))


# -- a peer that does not answer raises CommTimeoutError within the Comm's timeout -------------
SILENT_TIMEOUT = 1.0
SLACK = 3.0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_silent_peer_raises_comm_timeout_simulated(algorithm):
    """Rank 1 joins the first call (handshake and one reduction), then stops answering."""
    def fn(comm):
        reducer = sc.SparseAllreduce(algorithm, 0.1, comm=comm)
        reducer(_grad(500, comm.rank, 0))
        if comm.rank == 1:
            return None
        start = time.monotonic()
        try:
            reducer(_grad(500, comm.rank, 1))
        except CommTimeoutError:
            return time.monotonic() - start
        return "no error"

    waited = simulate(2, fn, timeout=SILENT_TIMEOUT).results[0]
    assert isinstance(waited, float) and SILENT_TIMEOUT - 0.05 <= waited <= SILENT_TIMEOUT + SLACK, waited


def _silent_peer_rank(rank, world_size):
    import torch.distributed as dist

    from sparsecomm.comm import TorchComm

    waited = {}
    for algorithm in ALGORITHMS:
        group = dist.new_group([0, 1])  # its own gloo pairs: a timeout closes only this group's
        comm = TorchComm(group, timeout=SILENT_TIMEOUT)
        reducer = sc.SparseAllreduce(algorithm, 0.1, comm=comm)
        reducer(_grad(500, rank, 0))
        if rank == 0:
            start = time.monotonic()
            try:
                reducer(_grad(500, rank, 1))
                waited[algorithm] = "no error"
            except CommTimeoutError:
                waited[algorithm] = time.monotonic() - start
            except Exception as exc:  # noqa: BLE001
                waited[algorithm] = f"{type(exc).__name__}: {exc}"
        dist.barrier()  # the default group is untouched by the subgroup's timeout
    return waited


@pytest.mark.distributed
def test_silent_peer_raises_comm_timeout_on_gloo():
    waited = spawn(_silent_peer_rank, 2, timeout=180)[0]
    for algorithm in ALGORITHMS:
        seconds = waited[algorithm]
        assert isinstance(seconds, float) and SILENT_TIMEOUT - 0.05 <= seconds <= SILENT_TIMEOUT + SLACK, \
            (algorithm, seconds)


# -- NaN or Inf: one policy for every algorithm ---------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nonfinite_gradients_follow_one_policy(algorithm):
    """NaN on rank 0, +Inf on rank 1 and -Inf on rank 2 at one index (a dense sum gives NaN),
    +Inf on rank 3 at another. "propagate": every rank's result is the dense sum of the raw
    gradients (NaN and signed Inf at the same places, the finite rest equal up to summation
    order) and the residuals are what the previous step left; "raise": the same ValueError on
    every rank, naming all four ranks."""
    size, n = 4, 1000
    where = {0: {17: float("nan")}, 1: {900: float("inf")}, 2: {900: float("-inf")}, 3: {5: float("inf")}}

    def poisoned(rank):
        grad = _grad(n, rank, 1, dtype=torch.float32)
        for index, value in where[rank].items():
            grad[index] = value
        return grad

    def fn(comm):
        outcomes = {}
        for policy in ("propagate", "raise"):
            reducer = sc.SparseAllreduce(algorithm, 0.01, comm=comm, nonfinite=policy)
            reducer(_grad(n, comm.rank, 0, dtype=torch.float32))
            before = reducer.residual.clone()
            try:
                out = reducer(poisoned(comm.rank))
            except ValueError as exc:
                out = str(exc)
            outcomes[policy] = (out, torch.equal(before, reducer.residual))
        return outcomes

    results = simulate(size, fn).results
    dense = sum(poisoned(rank).double() for rank in range(size)).float()
    messages = set()
    for rank, outcomes in enumerate(results):
        out, unchanged = outcomes["propagate"]
        assert unchanged and torch.equal(out.isnan(), dense.isnan()), (algorithm, rank)
        assert {i for i in range(n) if out[i].isnan()} == {17, 900}, (algorithm, rank)
        assert out[5].item() == float("inf"), (algorithm, rank)
        finite = dense.isfinite()
        assert torch.equal(out.isfinite(), finite)
        torch.testing.assert_close(out[finite], dense[finite], rtol=1e-6, atol=1e-5)
        message, unchanged = outcomes["raise"]
        assert unchanged and isinstance(message, str), (algorithm, rank, message)
        messages.add(message)
    assert len(messages) == 1, messages
    assert messages.pop().startswith("non-finite gradient on ranks [0, 1, 2, 3] ("), algorithm


# -- float16 / bfloat16: reduced in float32, rounded once ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_half_gradients_reduced_in_float32_rounded_once(algorithm, dtype):
    """The reference: the same algorithm run on the gradients converted to float32; a half
    run must give that float32 result rounded once to the half dtype, and the same float32
    residual, at every step."""
    size, n, steps = 5, 1000, 3

    def fn(comm):
        runs = []
        for work in (dtype, torch.float32):
            reducer = sc.SparseAllreduce(algorithm, 0.05, comm=comm)
            run = []
            for step in range(steps):
                grad = _grad(n, comm.rank, step, dtype=dtype).to(work)  # the same values in both runs
                run.append((reducer(grad), reducer.residual.clone()))
            runs.append(run)
        return runs

    results = simulate(size, fn).results
    for rank in range(size):
        half_run, float_run = results[rank]
        for step in range(steps):
            (half_out, half_res), (float_out, float_res) = half_run[step], float_run[step]
            assert half_out.dtype == dtype and half_res.dtype == torch.float32
            assert torch.equal(half_out, float_out.to(dtype)), (algorithm, dtype, rank, step)
            assert torch.equal(half_res, float_res), (algorithm, dtype, rank, step)
    # the data tell the two apart: summing in the half dtype rounds differently
    grads = [_grad(n, r, 0, dtype=dtype) for r in range(size)]
    in_half = grads[0].clone()
    for g in grads[1:]:
        in_half += g
    in_float = sum(g.float() for g in grads).to(dtype)
    assert not torch.equal(in_half, in_float)


# -- messages are uint8 tensors in documented layouts ---------------------------------------------
def _header_problems(payload: torch.Tensor, sender: int, n: int) -> list[str]:
    """What in this payload's first 32 bytes breaks formats/header.py's layout, read here with
    numpy from the documented offsets (not with sparsecomm's parser)."""
    from sparsecomm.formats.header import FORMAT_VERSION, Kind

    raw = payload[:32].numpy().tobytes()
    if len(raw) < 32:
        return [f"{len(raw)} bytes, shorter than the header"]
    magic = int.from_bytes(raw[0:4], "little")
    version = int.from_bytes(raw[4:6], "little")
    kind, value_code, index_code = raw[6], raw[7], raw[8]
    problems = []
    if magic != 0x4D435053 or raw[0:4] != b"SPCM":
        problems.append(f"magic {magic:#x}")
    if version != FORMAT_VERSION:
        problems.append(f"version {version}")
    if kind not in {k.value for k in Kind}:
        problems.append(f"kind {kind}")
    if value_code not in range(1, 8) or index_code not in range(0, 8):
        problems.append(f"dtype codes {value_code}, {index_code}")
    if raw[9:12] != b"\0\0\0":
        problems.append("reserved bytes not zero")
    if int.from_bytes(raw[12:16], "little") != sender:
        problems.append(f"sender {int.from_bytes(raw[12:16], 'little')}, sent by rank {sender}")
    return problems


@pytest.mark.parametrize("algorithm", SELECTING)   # dense sends no sparsecomm message: the backend's allreduce
def test_messages_are_uint8_in_documented_layouts(algorithm, monkeypatch):
    """Every payload a rank sends in a reduction (after the handshake) is a 1-D uint8 tensor
    that is one of: a message that starts with the documented 32-byte header (sender = the
    sending rank); a variable-size message's size, one little-endian int64 sent just before it
    to the same peer (docs/architecture.md, "Variable sizes"), followed by exactly that many
    bytes, or, for 0, by one zero byte; a message of several all-gather blocks, headed by their
    sizes (int64 each, >= 32) and then the headed blocks; or the reducer's agreement records
    (formats/header.py: 15 little-endian int64 per rank, magic 0x4D435053, format version 1,
    kind 2 for a later call, ..., the non-finite flag last: 0 = finite), all-gathered before
    the algorithm: a Bruck round of 1..4 records of 120 B."""
    from sparsecomm.comm.simulated import SimComm

    size, n = 5, 1025
    sent: list[tuple[int, int, torch.Tensor]] = []
    post = SimComm._post_and_wait

    def recording_post(self, sends, recvs, **how):
        if getattr(self, "recording", False):
            sent.extend((self.rank, peer, payload.clone()) for peer, payload in sends)
        return post(self, sends, recvs, **how)

    monkeypatch.setattr(SimComm, "_post_and_wait", recording_post)

    def fn(comm):
        reducer = sc.SparseAllreduce(algorithm, 0.02, comm=comm)
        reducer(_grad(n, comm.rank, 0, dtype=torch.float32))          # with the handshake: not recorded
        comm.recording = True
        reducer(_grad(n, comm.rank, 1, dtype=torch.float32))
        return True

    simulate(size, fn)
    assert sent, algorithm
    headed = 0
    announced: dict[tuple[int, int], int] = {}   # (sender, peer) -> the size its last size word said
    for sender, peer, payload in sent:
        assert payload.dtype == torch.uint8 and payload.dim() == 1 and payload.is_contiguous()
        raw = payload.numpy().tobytes()
        words = np.frombuffer(raw[:len(raw) // 8 * 8], dtype="<i8")
        want = announced.pop((sender, peer), None)
        if want is not None:   # the message a size word announced
            assert len(raw) == max(want, 1), (algorithm, sender, peer, want, len(raw))
            if want == 0:
                assert raw == b"\0", (algorithm, sender, peer, raw)
                continue
        if len(raw) % 120 == 0 and words[0] == 0x4D435053 and words[1] == 1:   # agreement records
            records = words.reshape(-1, 15)
            assert len(records) <= size - 1, (algorithm, sender, peer, len(records))
            assert (records[:, 0] == 0x4D435053).all() and (records[:, 1] == 1).all(), (algorithm, records)
            assert (records[:, 2] == 2).all() and (records[:, -1] == 0).all(), (algorithm, records)  # finite
            continue
        if len(raw) == 8 and want is None:   # a size word: the next message to this peer has that size
            assert words[0] == 0 or words[0] >= 32, (algorithm, sender, peer, words)
            announced[(sender, peer)] = int(words[0])
            continue
        if raw[:4] != b"SPCM":   # several all-gather blocks behind their sizes
            c = next((c for c in range(2, size) if 8 * c + int(words[:c].sum()) == len(raw)), None)
            assert c is not None and (words[:c] >= 32).all(), (algorithm, sender, peer, words[:size])
            offset = 8 * c
            for j, b in enumerate(words[:c]):   # the first block is the sender's own, the others forwarded
                problems = _header_problems(payload[offset:offset + int(b)], sender, n)
                if j:
                    problems = [p for p in problems if not p.startswith("sender")]
                assert not problems, (algorithm, sender, peer, j, problems)
                offset += int(b)
            headed += 1
            continue
        problems = _header_problems(payload, sender, n)
        assert not problems, (algorithm, sender, peer, len(raw), problems)
        headed += 1
    assert not announced, (algorithm, announced)
    assert headed > 0, algorithm


# -- nothing a peer sends is unpickled -----------------------------------------------------------
def _arm_unpickling_traps() -> list[str]:
    """Replace every unpickling entry point with one that records the call and raises."""
    import _pickle
    import multiprocessing.reduction
    import pickle

    import torch.distributed.distributed_c10d as c10d

    calls: list[str] = []

    def trap(name):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called: something was unpickled")
        return refuse

    for module, attr in [(pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (_pickle, "loads"),
                         (_pickle, "load"), (_pickle, "Unpickler"), (torch, "load"), (c10d, "_unpickler"),
                         (multiprocessing.reduction.ForkingPickler, "loads")]:
        setattr(module, attr, trap(f"{getattr(module, '__name__', module)}.{attr}"))
    return calls


def _no_unpickle_rank(rank, world_size):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sparsecomm.comm import TorchComm

    # DDP's constructor imports torch._dynamo, whose modules subclass pickle.Unpickler: loaded
    # after the traps replace that class, they would fail to define their subclasses
    import torch._dynamo  # noqa: F401
    calls = _arm_unpickling_traps()
    comm = TorchComm()
    sums = {}
    for algorithm in ALGORITHMS:
        reducer = sc.SparseAllreduce(algorithm, 0.05, comm=comm)
        for step in range(2):
            out = reducer(_grad(2000, rank, step, dtype=torch.float32))
        sums[algorithm] = float(out.double().sum())
    for algorithm in ALGORITHMS:
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)), bucket_cap_mb=0.001)
        model.register_comm_hook(sc.DDPHookState(algorithm, 0.1), sc.ddp_hook)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            model(torch.randn(4, 8, generator=gen)).square().sum().backward()
    during_run = list(calls)
    # the traps are armed: torch.distributed's object collective unpickles and is caught
    try:
        dist.all_gather_object([None] * world_size, rank)
        probe = "all_gather_object worked"
    except AssertionError:
        probe = "trapped"
    return during_run, probe, sums


@pytest.mark.distributed
def test_nothing_a_peer_sends_is_unpickled():
    size = 3
    runs = spawn(_no_unpickle_rank, size, timeout=240)
    for rank, (during_run, probe, sums) in enumerate(runs):
        assert during_run == [], (rank, during_run)
        assert probe == "trapped", (rank, probe)
        assert sums == runs[0][2], rank


# -- the measured time-to-accuracy tables are the committed runs' ----------------------------
#: time-to-accuracy table in README.md or docs/results.md -> the JSON written by the run it shows (examples/ddp_demo.py --out ...)
TIME_TO_ACCURACY_RUNS = ["docs/results/demo.json", "docs/results/demo_recipe_plain.json",
                         "docs/results/demo_recipe_mc.json", "docs/results/demo_mlp_generated.json",
                         "docs/results/demo_50mbit.json", "docs/results/demo_P6.json", "docs/results/demo_gssgd.json"]


@pytest.mark.parametrize("path", TIME_TO_ACCURACY_RUNS)
def test_readme_time_to_accuracy_tables_are_the_committed_runs(path):
    """Every row of a time-to-accuracy table in the README is the row the benchmark prints from
    that run's JSON (so a re-run updates both or the test fails), and every method of the run
    either reached the target or says it did not."""
    import json
    import os

    from sparsecomm.bench.accuracy import format_table, time_to_target

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, path)) as f:
        report = json.load(f)
    readme = ""
    for doc in ("README.md", os.path.join("docs", "results.md")):  # the README shows a few rows, results.md all
        with open(os.path.join(root, doc)) as f:
            readme += f.read()
    for m in report["methods"]:  # the stored time to target is the curve's
        assert (m["time_to_target_s"], m["updates_to_target"]) == time_to_target(m["curve"], report["target"])
    for line in format_table(report).splitlines()[2:]:
        assert line in readme, f"README.md and docs/results.md lack this row of {path}: {line}"
