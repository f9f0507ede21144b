"""DenseStream ("DenseStream: A Novel Data Representation for Gradient Sparsification"):
the dense-block kernels and their wire format against numpy references written here, and
the ``densestream`` algorithm (Algorithm 2) against reference sums, the residual contract
and the cost bounds of section III-B (eqs. 4-6), on the simulated Comm and on gloo.

The shared invariants (conservation, identical bits, k, rounds, bytes within bounds) also
run in tests/test_algorithms.py's common matrix; this file holds what is specific.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import ops
from sparsecomm.comm import simulate
from sparsecomm.errors import WireFormatError
from sparsecomm.formats.densestream import (DenseBlocks, decode_densestream, densestream_max_zero_run,
                                            densestream_width, encode_densestream)
from sparsecomm.testing import spawn

from _reference import ref_k, ref_topk_indices

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


# -- references ---------------------------------------------------------------------------
def ref_width(n: int) -> int:
    """Fewest bytes holding n - 1 (at least 1), by counting."""
    w = 1
    while 256 ** w < n:
        w += 1
    return w


def ref_blocks(x: np.ndarray, t: int) -> list[tuple[int, int]]:
    """(start, length) of the canonical blocks of a dense vector: a block starts at a
    non-zero after more than t zeros (or at the first non-zero) and ends at the last
    non-zero before such a gap."""
    nz = np.flatnonzero(x != 0)
    blocks: list[list[int]] = []
    for i in nz.tolist():
        if blocks and i - blocks[-1][1] - 1 <= t:
            blocks[-1][1] = i
        else:
            blocks.append([i, i])
    return [(a, b - a + 1) for a, b in blocks]


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype in (torch.float16, torch.bfloat16) else t.numpy()


def check_canonical(got, x: torch.Tensor, t: int) -> None:
    """``got`` (starts, lengths, values) is exactly the canonical DenseStream of ``x``."""
    starts, lengths, values = got
    want = ref_blocks(as_np(x), t)
    assert list(zip(starts.tolist(), lengths.tolist())) == want
    expect = torch.cat([x[s:s + l] for s, l in want]) if want else x[:0]
    expect = torch.where(expect == 0, torch.zeros_like(expect), expect)  # zeros inside blocks are +0
    assert values.dtype == x.dtype and torch.equal(values.view(torch.uint8) if values.numel() else values,
                                                   expect.view(torch.uint8) if expect.numel() else expect)


def clustered(n: int, gen: torch.Generator, dtype=torch.float32, fill=0.6, gap=12, run=20) -> torch.Tensor:
    """Block-structured values: runs of mostly non-zeros separated by random gaps; small
    integers so that sums cancel now and then; some -0.0."""
    x = torch.zeros(n, dtype=torch.float64)
    i = 0
    while i < n:
        i += int(torch.randint(0, gap, (1,), generator=gen))
        length = 1 + int(torch.randint(0, run, (1,), generator=gen))
        seg = torch.randint(-4, 5, (max(0, min(length, n - i)),), generator=gen).double()
        keep = torch.rand(seg.numel(), generator=gen) < fill
        x[i:i + seg.numel()] = torch.where(keep, seg, torch.zeros_like(seg))
        i += length
    x[torch.rand(n, generator=gen) < 0.02] = -0.0
    return x.to(dtype)


def random_sparse(n: int, m: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    x = torch.zeros(n, dtype=dtype)
    idx = torch.randperm(n, generator=gen)[:m]
    x[idx] = torch.randn(m, generator=gen).to(dtype)
    return x


def coo_of(x: torch.Tensor, index_dtype=torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.nonzero(x != 0).reshape(-1)
    return idx.to(index_dtype), x[idx]


# -- width, zero-run threshold ------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 255, 256, 257, 65536, 65537, 15_000_000, 2**32, 2**32 + 1, 2**63 - 1])
def test_width_is_the_fewest_bytes_holding_n_minus_1(n):
    assert densestream_width(n) == ref_width(n)
    if n >= 2:  # the paper's ceil(log2(N) / 8)
        assert densestream_width(n) == math.ceil(math.ceil(math.log2(n)) / 8)


@pytest.mark.parametrize("dtype,n,t", [(torch.float32, 15_000_000, 2), (torch.float32, 1000, 1),
                                       (torch.float64, 15_000_000, 1), (torch.float16, 15_000_000, 3),
                                       (torch.bfloat16, 300, 2), (torch.float32, 2**40, 3)])
def test_max_zero_run_is_ceil_two_width_over_k(dtype, n, t):
    assert densestream_max_zero_run(n, dtype) == t


# -- encode / decode ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["random", "clustered", "dense", "zeros"])
@pytest.mark.parametrize("n", [1, 2, 97, 20_000])
def test_encode_round_trip(dtype, kind, n):
    gen = torch.Generator().manual_seed(n)
    if kind == "random":
        x = random_sparse(n, max(1, n // 20), gen, dtype)
    elif kind == "clustered":
        x = clustered(n, gen, dtype)
    elif kind == "dense":
        x = (torch.arange(n) % 5 + 1).to(dtype)
    else:
        x = torch.zeros(n, dtype=dtype)
    t = densestream_max_zero_run(n, dtype)
    dense_enc = ops.densestream_encode_dense(x)
    check_canonical(dense_enc, x, t)
    for it in (torch.int32, torch.int64):
        idx, val = coo_of(x, it)
        coo_enc = ops.densestream_encode_coo(idx, val, n)
        assert all(torch.equal(a, b) for a, b in zip(coo_enc, dense_enc))
    if kind == "dense":
        assert dense_enc[0].tolist() == [0] and dense_enc[1].tolist() == [n]
    if kind == "zeros":
        assert dense_enc[0].numel() == 0 and dense_enc[2].numel() == 0
    back = ops.densestream_add_into_(torch.zeros(n, dtype=dtype), dense_enc)
    assert torch.equal(back, x + 0)  # -0.0 comes back as +0.0
    idx, val = ops.densestream_to_coo(dense_enc, n)
    want_idx, want_val = coo_of(x)
    assert torch.equal(idx, want_idx) and torch.equal(val, want_val)


def test_coo_entries_with_zero_values_vanish():
    # k >= N: a top-k of a mostly zero vector selects zeros; they are zeros of the stream
    n = 10
    idx = torch.arange(n)
    val = torch.tensor([0.0, -0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0, -0.0])
    s, l, v = ops.densestream_encode_coo(idx, val, n)
    assert s.tolist() == [2, 7] and l.tolist() == [1, 1] and v.tolist() == [3.0, 5.0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [None, 1, 2, 3, 4, 8])
def test_zero_run_rule_at_its_boundary(dtype, width):
    """A run of exactly T zeros stays inside the block; T + 1 zeros split it (section III-A,
    rule 2: a block holds no run of more than ceil(2 width / K) zeros)."""
    n = 64
    w = densestream_width(n) if width is None else width
    k = torch.empty((), dtype=dtype).element_size()
    t = math.ceil(2 * w / k)
    x = torch.zeros(n, dtype=dtype)
    x[1] = 2
    x[2 + t] = -3            # T zeros after x[1]
    x[2 + t + 1 + t + 1] = 5  # T + 1 zeros after x[2 + t]
    s, l, v = ops.densestream_encode_dense(x, width=width)
    assert s.tolist() == [1, 2 * t + 4] and l.tolist() == [t + 2, 1]
    assert v.float().tolist() == [2.0] + [0.0] * t + [-3.0, 5.0]
    check_canonical((s, l, v), x, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["random", "clustered", "cancel", "one_empty"])
def test_add_merges_sums_and_resplits(dtype, kind):
    n = 5000
    gen = torch.Generator().manual_seed(hash(kind) % 1000)
    if kind == "random":
        a, b = random_sparse(n, 300, gen, dtype), random_sparse(n, 400, gen, dtype)
    else:
        a, b = clustered(n, gen, dtype), clustered(n, gen, dtype)
    if kind == "cancel":
        b = torch.where(torch.rand(n, generator=gen) < 0.5, -a, b)  # many sums are exactly 0
    if kind == "one_empty":
        b = torch.zeros(n, dtype=dtype)
    # element-wise a + b in the kernels' arithmetic: float32 for the half types, rounded once
    work = torch.float64 if dtype == torch.float64 else torch.float32
    want = (a.to(work) + b.to(work)).to(dtype)
    got = ops.densestream_add(ops.densestream_encode_dense(a), ops.densestream_encode_dense(b), n)
    check_canonical(got, want, densestream_max_zero_run(n, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_slice_by_index_range(dtype):
    n = 3000
    gen = torch.Generator().manual_seed(7)
    x = clustered(n, gen, dtype)
    enc = ops.densestream_encode_dense(x)
    t = densestream_max_zero_run(n, dtype)
    cuts = [(0, n), (0, 0), (n, n), (5, 6), (17, 2500)]
    cuts += [tuple(sorted(torch.randint(0, n + 1, (2,), generator=gen).tolist())) for _ in range(20)]
    for lo, hi in cuts:
        part = torch.zeros_like(x)
        part[lo:hi] = x[lo:hi]
        check_canonical(ops.densestream_slice(enc, n, lo, hi), part, t)
    with pytest.raises(ValueError, match=r"0 <= lo <= hi <= n"):
        ops.densestream_slice(enc, n, 10, 5)


@pytest.mark.parametrize("blocks,n,match", [
    (([5, 0], [2, 2], [1.0] * 4), 20, "strictly ascending|does not follow"),   # unsorted
    (([0, 1], [2, 2], [1.0] * 4), 20, "strictly ascending|does not follow"),   # overlapping
    (([0, 19], [2, 2], [1.0] * 4), 20, "lengths"),                              # past N
    (([0, 5], [2, 0], [1.0] * 2), 20, "lengths"),                               # empty block
    (([0, 5], [2, 2], [1.0] * 5), 20, "values"),                                # lengths sum != values
    (([-1], [2], [1.0] * 2), 20, "starts"),
])
def test_kernels_reject_malformed_blocks(blocks, n, match):
    s, l, v = (torch.tensor(blocks[0], dtype=torch.int64), torch.tensor(blocks[1], dtype=torch.int64),
               torch.tensor(blocks[2]))
    dense = torch.zeros(n)
    with pytest.raises(ValueError, match=match):
        ops.densestream_add_into_(dense, (s, l, v))
    assert not dense.any()
    for call in (lambda: ops.densestream_to_coo((s, l, v), n), lambda: ops.densestream_slice((s, l, v), n, 0, n),
                 lambda: ops.densestream_add((s, l, v), ops.densestream_encode_dense(dense), n)):
        with pytest.raises(ValueError, match=match):
            call()


def test_kernel_argument_errors():
    with pytest.raises(ValueError, match="strictly ascending"):
        ops.densestream_encode_coo(torch.tensor([3, 1]), torch.tensor([1.0, 2.0]), 10)
    with pytest.raises(ValueError, match="< 10"):
        ops.densestream_encode_coo(torch.tensor([3, 10]), torch.tensor([1.0, 2.0]), 10)
    with pytest.raises(ValueError, match="width must be 1..8"):
        ops.densestream_encode_dense(torch.ones(3), width=9)
    with pytest.raises(TypeError):
        ops.densestream_encode_dense(torch.ones(3, dtype=torch.int32))


# -- wire -------------------------------------------------------------------------------------
def _message(starts, lengths, n, lo, hi, values=None, sender=2, width=None):
    """The layout of formats/densestream.py, packed by hand."""
    w = ref_width(n) if width is None else width
    nv = sum(lengths)
    values = [float(i + 1) for i in range(nv)] if values is None else values
    head = struct.pack("<IHBBB3sIQQ", 0x4D435053, 1, 4, 1, 0, b"\0\0\0", sender, n, len(starts))
    fixed = struct.pack("<qqqB7x", lo, hi, nv, w)
    fields = b"".join(s.to_bytes(8, "little")[:w] for s in starts) + b"".join(
        (x - 1).to_bytes(8, "little")[:w] for x in lengths)
    fields += bytes(-len(fields) % 8)
    vals = struct.pack(f"<{nv}f", *values)
    vals += bytes(-len(vals) % 8)
    return torch.frombuffer(bytearray(head + fixed + fields + vals), dtype=torch.uint8)


GOOD = ([300, 310, 400], [5, 2, 100], 1000, 250, 500)


def test_message_bytes_are_the_documented_layout():
    starts, lengths, n, lo, hi = GOOD
    nv = sum(lengths)
    d = DenseBlocks(n, lo, hi, torch.tensor(starts), torch.tensor(lengths),
                    torch.arange(1, nv + 1, dtype=torch.float32))
    assert torch.equal(encode_densestream(d, 2), _message(*GOOD))
    back = decode_densestream(_message(*GOOD), n=n, value_dtype=torch.float32, receiver=0, sender=2, lo=lo, hi=hi)
    assert back.starts.tolist() == starts and back.lengths.tolist() == lengths
    assert torch.equal(back.values, d.values) and (back.lo, back.hi) == (lo, hi)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 300, 70_000, 2**31 + 5])
def test_message_round_trip(dtype, n):
    gen = torch.Generator().manual_seed(3)
    m = min(n, 5000)
    x = clustered(m, gen, dtype)
    s, l, v = ops.densestream_encode_dense(x, width=densestream_width(n))
    off = n - m  # blocks at the top of a long vector: wide fields
    d = DenseBlocks(n, off, n, s + off, l, v)
    msg = encode_densestream(d, 1)
    assert msg.dtype == torch.uint8
    back = decode_densestream(msg, n=n, value_dtype=dtype, receiver=0, sender=1, lo=off, hi=n)
    assert torch.equal(back.starts, d.starts) and torch.equal(back.lengths, d.lengths)
    assert torch.equal(back.values.view(torch.uint8), v.view(torch.uint8))


def _flip(msg, pos, value):
    msg = msg.clone()
    msg[pos] = value
    return msg


MALFORMED = [  # (case, message, decode kwargs, error)
    ("unsorted", _message([310, 300, 400], [5, 2, 100], 1000, 250, 500), {}, r"block \[1\] starts at 300, before"),
    ("overlapping", _message([300, 302, 400], [5, 2, 100], 1000, 250, 500), {}, r"block \[1\] starts at 302, before"),
    ("past hi", _message([300, 310, 450], [5, 2, 100], 1000, 250, 500), {}, r"block \[2\] reaches 550, outside"),
    ("past N", _message([300, 310, 450], [5, 2, 100], 500, 0, 500), {"n": 500, "lo": 0, "hi": 500},
     r"block \[2\] reaches 550"),
    ("below lo", _message([200], [5], 1000, 250, 500), {}, r"block \[0\] reaches 200"),
    ("short", _message(*GOOD)[:-8], {}, r"of \d+ bytes; its header announces 3 entries"),
    ("truncated", _message(*GOOD)[:40], {}, r"shorter than its 64-byte fixed part"),
    ("width", _message([300], [5], 1000, 250, 500, width=3), {}, r"field width 3 bytes, but N = 1000 needs exactly 2"),
    ("range", _message(*GOOD), {"lo": 200}, r"range lo = 250 differs from the expected 200"),
    ("n", _message(*GOOD), {"n": 999}, r"n differs: rank 2 sent 1000, rank 0 expected 999"),
    ("dtype", _message(*GOOD), {"value_dtype": torch.float64}, r"value_dtype differs"),
    ("reserved", _flip(_message(*GOOD), 60, 1), {}, r"reserved header byte 60"),
    ("padding", _flip(_message(*GOOD), 77, 9), {}, r"padding byte 77 is 0x09"),
    ("kind", _flip(_message(*GOOD), 6, 1), {}, r"kind differs: rank 2 sent COO, rank 0 expected DENSE_BLOCKS"),
    ("nvalues", _flip(_message(*GOOD), 48, 200), {}, r"header announces 3 entries"),  # sized by nvalues
    ("lengths", _flip(_message(*GOOD), 74, 98), {}, r"lengths sum to 106"),  # last length 100 -> 99
]


@pytest.mark.parametrize("case,msg,kwargs,match", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_decoder_rejects_malformed_messages(case, msg, kwargs, match):
    args = {"n": 1000, "value_dtype": torch.float32, "receiver": 0, "sender": 2, "lo": 250, "hi": 500, **kwargs}
    with pytest.raises(WireFormatError, match=match):
        decode_densestream(msg, **args)


# -- the algorithm ----------------------------------------------------------------------------
def _history(comm, density, grads_by_step):
    reducer = sc.SparseAllreduce("densestream", density, comm=comm)
    alg = reducer.algorithm
    out = []
    for grads in grads_by_step:
        o = reducer(grads[comm.rank].clone())
        out.append((o.clone(), reducer.residual.clone(), dict(reducer.last_stats),
                    {p: dict(v) for p, v in alg.last_phases.items()}, list(alg.last_boundaries)))
    return out


def tree_sum(sent: list[torch.Tensor]) -> torch.Tensor:
    """The reference of the summation order the module documents: fold partners r + (r + p2)
    first, then the butterfly over distances p2/2 .. 1 with the lower rank's sum on the left.
    Dense, element-wise; every rank of the butterfly ends with the same vector."""
    p = len(sent)
    p2 = 1 << (p.bit_length() - 1)
    v = [sent[r] + sent[r + p2] if r + p2 < p else sent[r] + 0 for r in range(p2)]
    d = p2 // 2
    while d >= 1:
        v = [v[min(r, r ^ d)] + v[max(r, r ^ d)] for r in range(p2)]
        d //= 2
    return v[0]


def rank_order_sum(sent: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros_like(sent[0])
    for s in sent:
        total = total + s
    return total


def gradients(pattern: str, n: int, size: int, step: int, integer: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 17)
    grads = []
    for rank in range(size):
        if pattern == "clustered":  # block-structured supports that differ per rank
            g = clustered(n, gen, torch.float64, fill=0.8, gap=40, run=30) * (rank + 1)
            g += torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3
        elif pattern == "same_support":  # identical supports (n/16 entries): eqs. 4-5's lower bound
            g = torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3
            g[::16] = 10.0 + rank + torch.rand(len(range(0, n, 16)), generator=gen, dtype=torch.float64)
        elif pattern == "disjoint":  # rank r's large entries in its own stripe
            g = torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3
            lo, hi = rank * n // size, (rank + 1) * n // size
            g[lo:hi] *= 1e4
        else:
            g = torch.randn(n, generator=gen, dtype=torch.float64)
        if integer:  # exactly representable sums in any order: bit-exact against rank order
            g = torch.round(g * 64)
        grads.append(g.float())
    return grads


def selections(grads_by_step, n, k):
    """Per step: each rank's selected vector (dense) and its residual after, in float32."""
    size = len(grads_by_step[0])
    residual = [torch.zeros(n) for _ in range(size)]
    steps = []
    for grads in grads_by_step:
        sent_all, res_all = [], []
        for r in range(size):
            acc = grads[r] + residual[r]
            sel = torch.from_numpy(ref_topk_indices(acc, k))
            sent = torch.zeros(n)
            sent[sel] = acc[sel]
            residual[r] = acc - sent
            sent_all.append(sent)
            res_all.append(residual[r].clone())
        steps.append((sent_all, res_all))
    return steps


SIM = [  # (P, N, density, pattern, integer values)
    (1, 1000, 0.05, "random", False),
    (2, 1000, 0.05, "clustered", False),
    (3, 2001, 0.1, "clustered", True),
    (4, 4096, 0.05, "same_support", False),
    (5, 3000, 0.01, "disjoint", True),
    (6, 1, 0.5, "random", False),
    (7, 2, 0.5, "random", False),
    (8, 5000, 0.1, "clustered", False),
    (8, 2000, 1.0, "random", True),  # k >= N
    (12, 4000, 0.02, "random", True),
    (16, 8000, 0.05, "clustered", True),
    (33, 3300, 0.03, "clustered", False),
]


@pytest.mark.parametrize("size,n,density,pattern,integer", SIM)
def test_densestream_sums_exactly_and_conserves(size, n, density, pattern, integer):
    steps = 2
    grads_by_step = [gradients(pattern, n, size, s, integer) for s in range(steps)]
    res = simulate(size, lambda comm: _history(comm, density, grads_by_step)).results
    k = ref_k(density, n)
    for step, (sent, residuals) in enumerate(selections(grads_by_step, n, k)):
        outs = [res[r][step][0] for r in range(size)]
        for r in range(size):
            assert torch.equal(outs[r], outs[0]), f"rank {r} differs from rank 0"
            assert torch.equal(res[r][step][1], residuals[r]), f"rank {r}: residual is not what it did not select"
        # bit-exact: along the documented tree; for integer values also the rank-order sum
        assert torch.equal(outs[0], tree_sum(sent))
        if integer:
            assert torch.equal(outs[0], rank_order_sum(sent))
        assert res[0][step][2]["nnz_out"] == int(torch.count_nonzero(outs[0]))


def _phase_bounds(size, n, k, phases, pattern, stats, rank, can_probe=False):
    """Counted bytes = boundary all-reduce + the messages (+ size headers); the elements
    each phase sends within eqs. 4-5 (P -> p2, k -> the core's selection), and bytes per
    element within what a block can cost."""
    p2 = 1 << (size.bit_length() - 1)
    lg = int(math.log2(p2))
    boundary = (size - 1) * (32 + 8 * (p2 - 1))  # the Bruck all-gather of the headed int64 proposals
    msgs = sum(p["messages"] for p in phases.values())
    assert stats["bytes_sent"] == boundary + sum(p["bytes"] for p in phases.values()) + (0 if can_probe else 8 * msgs)
    w, t = densestream_width(n), densestream_max_zero_run(n, torch.float32)
    for name, p in phases.items():
        # a message: the 64-byte prefix, 4 bytes per value, 2w per block, at most 14 padding bytes
        assert p["bytes"] <= p["messages"] * (64 + 14) + 4 * p["values"] + 2 * w * p["blocks"]
        assert p["bytes"] >= p["messages"] * 64 + 4 * p["values"] + 2 * w * p["blocks"]
        assert p["values"] <= p["nonzeros"] * (1 + t) and p["blocks"] <= p["nonzeros"]
    k_core = 2 * k if size != p2 else k
    sr = phases.get("scatter_reduce", {"nonzeros": 0, "messages": 0})
    ag = phases.get("allgatherv", {"nonzeros": 0, "messages": 0})
    assert sr["messages"] == ag["messages"] == (lg if rank < p2 else 0)
    # eq. 4: log2(P)/2 P k upper bound; here even (p2 - 1) k_core (each round at most what is held)
    assert sr["nonzeros"] <= min((p2 - 1) * k_core, lg / 2 * p2 * k_core)
    if pattern == "same_support":
        assert ag["nonzeros"] <= (p2 - 1) * k_core
    if pattern == "same_support" and size == p2 and k % p2 == 0:
        # identical supports: every rank proposes the same boundaries, each partition holds
        # exactly k/P entries, and both phases reach eqs. 4-5's lower bound (P-1)/P k
        assert sr["nonzeros"] == ag["nonzeros"] == (p2 - 1) * k // p2


def _exact_phase_volumes(size, sent, out, bounds, phases, rank):
    """What each phase of section III-B must send, entry for entry, computed here from the
    ranks' selections ``sent`` (dense), the result ``out`` and the averaged boundaries:

    * fold (any P): a folded rank r >= p2 sends its selection to r - p2 and receives the
      whole result back, so it sends nnz(sent_r) and its partner nnz(out);
    * scatter-reduce (recursive halving, Fig. 3): before the round of distance d, core rank
      r holds the partitions of its aligned group of 2d ranks, summed over the ranks s with
      s = r (mod 2d) (their fold partners included), and sends the half that is not its own;
    * allgatherv (recursive doubling): in the round of distance d it sends the d reduced
      partitions of its aligned group of d ranks, i.e. the result over
      [B_(r & ~(d-1)), B_(r & ~(d-1) + d)).

    Non-zeros are counted (blocks may carry zeros); sums of these random values do not
    cancel to exact zeros."""
    p2 = 1 << (size.bit_length() - 1)
    b = bounds
    core = [sent[r].double() + (sent[r + p2].double() if r + p2 < size else 0) for r in range(p2)]

    def nnz(v, lo, hi):
        return int(torch.count_nonzero(v[lo:hi]))

    got = {ph: phases.get(ph, {"nonzeros": 0})["nonzeros"] for ph in ("fold", "scatter_reduce", "allgatherv")}
    if rank >= p2:
        assert got == {"fold": nnz(sent[rank], 0, len(out)), "scatter_reduce": 0, "allgatherv": 0}, (rank, got)
        return
    want_fold = nnz(out, 0, len(out)) if rank + p2 < size else 0
    want_sr, d = 0, p2 // 2
    while d >= 1:
        held = sum(core[s] for s in range(p2) if s % (2 * d) == rank % (2 * d))
        give = (rank ^ d) & ~(d - 1)  # the peer's half: d partitions from there
        want_sr += nnz(held, b[give], b[give + d])
        d //= 2
    want_ag, d = 0, 1
    while d < p2:
        g = rank & ~(d - 1)
        want_ag += nnz(out, b[g], b[g + d])
        d *= 2
    assert got == {"fold": want_fold, "scatter_reduce": want_sr, "allgatherv": want_ag}, (rank, got)


@pytest.mark.parametrize("size,pattern", [(2, "same_support"), (4, "same_support"), (8, "same_support"),
                                          (4, "disjoint"), (6, "clustered"), (16, "random")])
def test_densestream_cost_within_the_papers_bounds(size, pattern):
    n, density = 7168, 0.0625  # k = 448 = n/16, divisible by 2, 4, 8
    grads_by_step = [gradients(pattern, n, size, 0, False)]
    res = simulate(size, lambda comm: _history(comm, density, grads_by_step)).results
    k = ref_k(density, n)
    p2 = 1 << (size.bit_length() - 1)
    sent = selections(grads_by_step, n, k)[0][0]
    # section III-B-1: the mean over all P ranks of each one's p2 - 1 proposals
    props = [np.sort(ref_topk_indices(grads_by_step[0][r], k)) for r in range(size)]
    want_bounds = [0] + [sum(int(p[j * k // p2]) for p in props) // size for j in range(1, p2)] + [n]
    for r in range(size):
        out, _, stats, phases, bounds = res[r][0]
        assert bounds == want_bounds, (r, bounds, want_bounds)
        # rounds: the boundary all-reduce; a core rank's log2 p2 + log2 p2 data rounds; a fold
        # partner's or folded rank's two fold rounds; no size rounds (inside a reducer call the
        # simulated Comm sends each message's size just before it, as gloo)
        folds = 2 if (r >= p2 or r < size - p2) else 0
        data = 2 * int(math.log2(p2)) if r < p2 else 0
        assert stats["rounds"] == math.ceil(math.log2(size)) + data + folds, (r, stats)
        _phase_bounds(size, n, k, phases, pattern, stats, r)
        assert bounds[0] == 0 and bounds[-1] == n and bounds == sorted(bounds) and len(bounds) == p2 + 1
        assert bounds == res[0][0][4]  # the same boundaries on every rank
        _exact_phase_volumes(size, sent, out, bounds, phases, r)


@pytest.mark.parametrize("size", [3, 4, 5, 6])
def test_boundaries_are_the_floor_of_the_mean_of_the_proposals(size):
    """Section III-B-1: every rank proposes p2 - 1 boundaries (positions floor(j k / p2) of
    its sorted selection) and the boundaries are the mean over all P ranks -- at P = 3, 5, 6
    the folded ranks' proposals count too (a mean over the power-of-two core only differs
    here, which the test checks first)."""
    n, density = 1000, 0.04  # k = 40
    k = 40
    p2 = 1 << (size.bit_length() - 1)
    gens = [torch.Generator().manual_seed(r) for r in range(size)]
    grads = [[random_sparse(n, 200, g) for g in gens]]
    res = simulate(size, lambda comm: _history(comm, density, grads)).results
    proposals = []
    for r in range(size):
        idx = np.sort(ref_topk_indices(grads[0][r], k))
        proposals.append([int(idx[j * k // p2]) for j in range(1, p2)])
    want = [0] + [sum(p[j] for p in proposals) // size for j in range(p2 - 1)] + [n]
    if size != p2:  # the case tells the two rules apart
        assert want != [0] + [sum(p[j] for p in proposals[:p2]) // p2 for j in range(p2 - 1)] + [n]
    for r in range(size):
        assert res[r][0][4] == want


def test_nonfinite_gradients_follow_the_reducers_policy():
    n = 500
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(3)]
    grads[1][7] = float("nan")

    def run(comm):
        reducer = sc.SparseAllreduce("densestream", 0.05, comm=comm)
        out = reducer(grads[comm.rank].clone())
        return out, reducer.residual.clone()

    res = simulate(3, run).results
    dense = grads[0] + grads[1] + grads[2]
    for out, residual in res:
        # the backend's dense allreduce (its own summation order), NaN where the input had one
        assert torch.equal(out.isnan(), dense.isnan())
        torch.testing.assert_close(out[~dense.isnan()], dense[~dense.isnan()])
        assert not residual.any()  # the residual did not change: no selection ran
    with pytest.raises(ValueError, match="non-finite"):
        simulate(3, lambda comm: sc.SparseAllreduce("densestream", 0.05, comm=comm, nonfinite="raise")(
            grads[comm.rank].clone()))


def _gloo_rank(rank, world_size, density, grads_by_step):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    return [(o.numpy(), r.numpy(), s, ph, b) for o, r, s, ph, b in _history(comm, density, grads_by_step)]


@pytest.mark.parametrize("size", range(1, 7))
def test_densestream_on_gloo(size):
    n, density = 3000, 0.05
    grads_by_step = [gradients("clustered", n, size, s, True) for s in range(2)]
    runs = spawn(_gloo_rank, size, density, grads_by_step, timeout=180)
    k = ref_k(density, n)
    for step, (sent, residuals) in enumerate(selections(grads_by_step, n, k)):
        want = rank_order_sum(sent)
        for r in range(size):
            out, residual, stats, phases, bounds = runs[r][step]
            assert torch.equal(torch.from_numpy(out), want), (size, r, step)
            assert torch.equal(torch.from_numpy(residual), residuals[r])
            _phase_bounds(size, n, k, phases, "clustered", stats, r)
            _exact_phase_volumes(size, sent, torch.from_numpy(out), bounds, phases, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_implementations_agree_with_the_kernels(dtype):
    """ops/_torch_impl/ (registered for CUDA) on CPU tensors: the same bits as the C kernels."""
    from sparsecomm.ops import _torch_impl as ti

    n = 4000
    gen = torch.Generator().manual_seed(11)
    a, b = clustered(n, gen, dtype), clustered(n, gen, dtype)
    b = torch.where(torch.rand(n, generator=gen) < 0.3, -a, b)

    def same(x, y):
        assert len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y))

    for width in (0, 4):
        ea, eb = ops.densestream_encode_dense(a, width=width or None), ops.densestream_encode_dense(b)
        same(ti.densestream_encode_dense(a, width), ea)
        idx, val = coo_of(a)
        same(ti.densestream_encode_coo(idx, val, n, width), ea)
        same(ti.densestream_add(*ea, *eb, n, width), ops.densestream_add(ea, eb, n, width=width or None))
        same(ti.densestream_slice(*ea, n, 100, 3000, width), ops.densestream_slice(ea, n, 100, 3000, width=width or None))
    dense = b.clone()
    ti.densestream_add_into_(dense, *ea)
    assert torch.equal(dense, ops.densestream_add_into_(b.clone(), ea))
    same(ti.densestream_to_coo(*ea, n), ops.densestream_to_coo(ea, n))
    bad = (torch.tensor([5, 0]), torch.tensor([2, 2]), torch.ones(4, dtype=dtype))
    with pytest.raises(ValueError, match="strictly ascending"):
        ti.densestream_to_coo(*bad, n)


@pytest.mark.parametrize("row,match", [([10, 5, 20], r"rank 2 a boundary proposal whose boundary \[1\] = 5 is outside"),
                                       ([10, 20, 101], r"rank 2 .*boundary \[2\] = 101"),
                                       ([-1, 20, 30], r"rank 2 .*boundary \[0\] = -1")])
def test_boundary_proposals_of_peers_are_validated(row, match):
    from sparsecomm.algorithms.densestream import check_proposals

    table = torch.tensor([[10, 20, 30], [0, 0, 100], [10, 20, 30]])
    check_proposals(table, 100, 0)
    table[2] = torch.tensor(row)
    with pytest.raises(WireFormatError, match=match):
        check_proposals(table, 100, 0)


@pytest.mark.parametrize("bad", [[900, 100, 500], [-1, 10, 20], [10, 20, 5000]])
def test_a_peers_bad_boundary_proposals_are_refused(monkeypatch, bad):
    """A rank whose proposals are outside [0, N] or decrease (a faulty or hostile peer) is
    refused: WireFormatError naming it, before any boundary is used (the other ranks are
    released by the simulated Comm's abort)."""
    import threading

    from sparsecomm.algorithms import densestream as mod
    real = mod.propose_boundaries

    def skewed(sorted_indices, parts):
        if threading.current_thread().name == "sim-rank-2":
            return torch.tensor(bad, dtype=torch.int64)
        return real(sorted_indices, parts)
    monkeypatch.setattr(mod, "propose_boundaries", skewed)
    n = 1000
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    with pytest.raises(WireFormatError, match="from rank 2 a boundary proposal"):
        simulate(4, lambda comm: sc.SparseAllreduce("densestream", 0.05, comm=comm)(grads[comm.rank].clone()))
