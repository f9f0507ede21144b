"""References for the outputs of ``_comm_checks.run_checks`` (shared by the gloo and MPI
tests): what each rank must have received and counted, recomputed here from the message
tables with plain arithmetic, never with the code under test.

``CASES`` is the table the tests parametrize over: ``(name, check, kwargs)``; every
check is called as ``check(outs, P, probe=..., **kwargs)`` with ``outs`` the per-rank
result dicts in rank order and ``probe`` whether the backend learns sizes by probing
(then ``exchange_var`` costs one round and no size header); a backend that does not probe
receives short (gloo), so inside a call with a bound its sizes travel with the messages.
"""

from __future__ import annotations

import math

import torch

import _comm_checks as cc

SIZE_HEADER = 8  # one int64 per message in the size round of a backend that cannot probe


def expected_payload(src, dst, idx, n) -> str:
    return cc.payload_bytes(src, dst, idx, n).hex()


def log_rounds(P: int) -> int:
    return math.ceil(math.log2(P)) if P > 1 else 0


def tensor_hex(t: torch.Tensor) -> str:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()


def from_hex(h: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(h)), dtype=torch.uint8).view(dtype).clone()


def check_ring(outs, P, probe):
    for r, out in enumerate(outs):
        if P == 1:
            assert out["ring_stats"] == [0, 0, 0]
            continue
        prv = (r - 1) % P
        assert out["ring"] == expected_payload(prv, r, 0, cc.ring_size(prv))
        assert out["ring_stats"] == [cc.ring_size(r), cc.ring_size(prv), 1]


def check_all_to_all(outs, P, probe):
    """Two messages per ordered pair in one round arrive in posting order."""
    for r, out in enumerate(outs):
        others = [q for q in range(P) if q != r]
        assert out["a2a"] == {str(q): [expected_payload(q, r, i, cc.a2a_size(q, r, i)) for i in (0, 1)]
                              for q in others}
        sent = sum(cc.a2a_size(r, q, i) for q in others for i in (0, 1))
        recv = sum(cc.a2a_size(q, r, i) for q in others for i in (0, 1))
        assert out["a2a_stats"] == [sent, recv, 1 if P > 1 else 0]


def check_exchange_var(outs, P, probe):
    """Without a probe a size round (one int64 per message) precedes the payload round."""
    header, rounds = (0, 1) if probe else (SIZE_HEADER, 2)
    for r, out in enumerate(outs):
        others = [q for q in range(P) if q != r]
        assert out["var"] == {str(q): expected_payload(q, r, 5, cc.var_size(q, r)) for q in others}
        sent = sum(cc.var_size(r, q) + header for q in others)
        recv = sum(cc.var_size(q, r) + header for q in others)
        assert out["var_stats"] == [sent, recv, rounds if P > 1 else 0]
        if P > 1:
            prv = (r - 1) % P
            assert out["var_ring"] == expected_payload(prv, r, 6, cc.var_size(prv, 0))
            assert out["var_ring_stats"] == [cc.var_size(r, 0) + header, cc.var_size(prv, 0) + header, rounds]


def check_allgather_small(outs, P, probe):
    ref = torch.stack([cc.small_input(q, torch.float64) for q in range(P)])
    nbytes = 6 * 8
    for out in outs:
        assert out["allgather_shape"] == [P, *cc.SMALL_SHAPE]
        assert out["allgather"] == tensor_hex(ref)
        assert out["allgather_stats"] == [(P - 1) * nbytes, (P - 1) * nbytes, log_rounds(P)]


def check_allreduce_small(outs, P, probe, dtype, op):
    dt = getattr(torch, dtype)
    xs = [cc.small_input(q, dt) for q in range(P)]
    ref = xs[0].clone()
    for x in xs[1:]:  # rank order, in the input dtype: the contract for bit-identity
        ref = ref + x if op == "sum" else torch.maximum(ref, x) if op == "max" else torch.minimum(ref, x)
    if op == "sum":
        assert torch.allclose(ref.double(), sum(x.double() for x in xs), rtol=1e-5, atol=1e-3)
    key = f"allreduce_small_{dtype}_{op}"
    assert {out[key] for out in outs} == {tensor_hex(ref)}, \
        "not bit-identical to the rank-order reference on every rank"
    nbytes = 6 * dt.itemsize
    for out in outs:
        assert out[key + "_stats"] == [(P - 1) * nbytes, (P - 1) * nbytes, log_rounds(P)]


def check_allreduce_dense(outs, P, probe, dtype):
    dt = getattr(torch, dtype)
    xs = [cc.dense_input(q, dtype).double() for q in range(P)]
    ref = sum(xs)
    bound = 2 * P * torch.finfo(dt).eps * sum(x.abs() for x in xs) + 1e-300
    assert len({out[f"dense_{dtype}"] for out in outs}) == 1, "ranks disagree"
    got = from_hex(outs[0][f"dense_{dtype}"], dt).double()
    assert got.shape == ref.shape
    assert bool(((got - ref).abs() <= bound).all()), float((got - ref).abs().max())
    nbytes = cc.DENSE_N * dt.itemsize  # counted as a ring: 2(P-1) rounds of ceil(n/P)
    exp = [0, 0, 0] if P == 1 else [2 * (P - 1) * math.ceil(nbytes / P)] * 2 + [2 * (P - 1)]
    for out in outs:
        assert out[f"dense_{dtype}_same_object"] is True
        assert out[f"dense_{dtype}_stats"] == exp


def check_allreduce_dense_noncontiguous(outs, P, probe):
    ref = sum(cc.dense_input(q, "float32", 24).double() for q in range(P)).reshape(4, 6)
    for out in outs:
        got = from_hex(out["dense_noncontig"], torch.float32).reshape(4, 6).double()
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


def check_bruck_allgather(outs, P, probe):
    sizes = [cc.bruck_size(q) for q in range(P)]
    for r, out in enumerate(outs):
        assert out["bruck"] == [expected_payload(q, 0, 7, sizes[q]) for q in range(P)]
        assert out["bruck_stats"][1] == sum(sizes) - sizes[r]  # every other block, once
        assert out["bruck_stats"][2] == log_rounds(P)
        assert out["bruck_equal"] == [expected_payload(q, 0, 8, 16) for q in range(P)]
        assert out["bruck_equal_stats"] == [(P - 1) * 16, (P - 1) * 16, log_rounds(P)]
    # every byte sent is received exactly once
    assert sum(o["bruck_stats"][0] for o in outs) == sum(o["bruck_stats"][1] for o in outs) \
        == (P - 1) * sum(sizes)


def bruck_var_received(P: int, r: int, sizes, size_word: int, filler: int) -> int:
    """Bytes rank r receives in the variable-size Bruck all-gather: at distance d, the
    min(d, P - d) blocks of ranks r + d, r + d + 1, ... in one message, headed by their sizes
    (8 bytes each) when there are several; each message after its own size (``size_word``
    bytes) and, if empty, as ``filler`` bytes."""
    total, d = 0, 1
    while d < P:
        count = min(d, P - d)
        body = sum(sizes[(r + d + j) % P] for j in range(count)) + (8 * count if count > 1 else 0)
        total += size_word + max(body, filler)
        d *= 2
    return total


def check_bruck_allgather_var(outs, P, probe):
    """Outside a call (no bound): every round of the all-gather after a round of its
    message's size, unless the backend probes."""
    sizes = [cc.bruck_var_size(q) for q in range(P)]
    word = 0 if probe else SIZE_HEADER
    for r, out in enumerate(outs):
        assert out["bruck_var"] == [expected_payload(q, 0, 9, sizes[q]) for q in range(P)]
        assert out["bruck_var_stats"][1] == bruck_var_received(P, r, sizes, word, 0)
        assert out["bruck_var_stats"][2] == (1 if probe else 2) * log_rounds(P)


def check_bounded_var(outs, P, probe):
    """Inside a call with a bound: one round per variable-size step, the size (8 bytes) just
    before each message and an empty one as a byte on a backend that receives short; no
    size at all where it probes."""
    word, filler = (0, 0) if probe else (SIZE_HEADER, 1)
    sizes = [cc.bruck_var_size(q) for q in range(P)]
    for r, out in enumerate(outs):
        others = [q for q in range(P) if q != r]
        assert out["var_bounded"] == {str(q): expected_payload(q, r, 10, cc.bounded_size(q, r)) for q in others}
        sent = sum(word + max(cc.bounded_size(r, q), filler) for q in others)
        recv = sum(word + max(cc.bounded_size(q, r), filler) for q in others)
        assert out["var_bounded_stats"] == [sent, recv, 1 if P > 1 else 0]
        assert out["bruck_var_bounded"] == [expected_payload(q, 0, 11, sizes[q]) for q in range(P)]
        assert out["bruck_var_bounded_stats"][1:] == [bruck_var_received(P, r, sizes, word, filler), log_rounds(P)]
    if P >= 3:   # the table has an empty message among these pairs
        assert any(cc.bounded_size(a, b) == 0 for a in range(P) for b in range(P) if a != b)


def check_barrier_and_bad_peers(outs, P, probe):
    for out in outs:
        assert out["barrier_stats"] == [P - 1, P - 1, log_rounds(P)]
        assert set(out["bad_peer"].values()) == {"ValueError"}, out["bad_peer"]


CASES = [
    ("ring", check_ring, {}),
    ("all_to_all", check_all_to_all, {}),
    ("exchange_var", check_exchange_var, {}),
    ("allgather_small", check_allgather_small, {}),
    *[(f"allreduce_small-{dt}-{op}", check_allreduce_small, {"dtype": dt, "op": op})
      for dt in ("float32", "int64") for op in ("sum", "max", "min")],
    *[(f"allreduce_dense-{dt}", check_allreduce_dense, {"dtype": dt}) for dt in cc.DENSE_DTYPES],
    ("allreduce_dense_noncontiguous", check_allreduce_dense_noncontiguous, {}),
    ("bruck_allgather", check_bruck_allgather, {}),
    ("bruck_allgather_var", check_bruck_allgather_var, {}),
    ("bounded_var", check_bounded_var, {}),
    ("barrier_and_bad_peers", check_barrier_and_bad_peers, {}),
]
CASE_IDS = [c[0] for c in CASES]


def check_timeout(outs, P, timeout):
    """Rank P-1's allreduce (nobody joins) and its receive from rank 0 (never sent) time
    out within the timeout plus slack, naming the right peers."""
    last = outs[P - 1]
    assert last["allreduce"] == "CommTimeoutError", last
    assert f"rank {P - 1}" in last["allreduce_msg"], last["allreduce_msg"]
    assert str(list(range(P - 1))) in last["allreduce_msg"], last["allreduce_msg"]
    assert timeout - 0.1 <= last["allreduce_s"] <= timeout + 3, last["allreduce_s"]
    assert last["exchange"] == "CommTimeoutError", last
    assert f"rank {P - 1}" in last["exchange_msg"] and "peer(s) [0]" in last["exchange_msg"], last["exchange_msg"]
    assert timeout - 0.1 <= last["exchange_s"] <= timeout + 3, last["exchange_s"]
