"""ZEN ("ZEN: Empowering Distributed Training with Sparsity-driven Data Synchronization",
OSDI 2025): the hash partition and class bitmap ops against references written here (the
hash in plain Python integers), the ``zen`` algorithm against the exact sum of every rank's
top-k at several P with each pull form, its load balance against the range split of
``sparcml_split_allgather``, and its decoders on malformed messages.

The shared invariants (conservation, identical bits, resume, hook) run in the common
matrices (tests/test_algorithms.py and friends); this file holds what is specific.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import algorithms, ops
from sparsecomm.comm import simulate
from sparsecomm.errors import WireFormatError
from sparsecomm.formats import zen as zf
from sparsecomm.formats.coo import encode_coo

from _reference import ref_topk_indices

M64 = (1 << 64) - 1
SEED = 0x5A454E   # the algorithm's documented default


# -- references ---------------------------------------------------------------------------
def ref_owner(i: int, parts: int, seed: int, block: int) -> int:
    """fastrange(splitmix64 output of (block number + seed + golden gamma), parts)."""
    z = ((i // block) + seed + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return ((z >> 32) * parts) >> 32


def ref_class(n: int, parts: int, seed: int, block: int, owner: int) -> list[int]:
    return [i for i in range(n) if ref_owner(i, parts, seed, block) == owner]


def ref_bitmap(idx: list[int], cls: list[int]) -> bytes:
    pos = {v: j for j, v in enumerate(cls)}
    out = bytearray((len(cls) + 7) // 8)
    for i in idx:
        out[pos[i] // 8] |= 1 << (pos[i] % 8)
    return bytes(out)


# -- ops ----------------------------------------------------------------------------------
def _path(torch_path: bool):
    """The torch implementations (the GPU fallback) or the C kernels."""
    return ops.use_torch_ops() if torch_path else contextlib.nullcontext()


@pytest.mark.parametrize("torch_path", [False, True], ids=["C", "torch"])
@pytest.mark.parametrize("parts,block,seed", [(1, 1, 0), (3, 1, 5), (5, 4, SEED), (8, 64, 2**63 - 1), (33, 2, 7)])
def test_partition_matches_the_reference_hash(parts, block, seed, torch_path):
    n = 1000
    rng = np.random.default_rng(parts)
    idx = np.sort(rng.choice(n, 300, replace=False))
    val = torch.from_numpy(rng.standard_normal(300).astype(np.float32))
    owners = [ref_owner(int(i), parts, seed, block) for i in idx]
    order = sorted(range(len(idx)), key=lambda j: (owners[j], idx[j]))  # stable: ascending within an owner
    with _path(torch_path):
        got_i, got_v, counts = ops.zen_partition(torch.from_numpy(idx), val, n, parts, seed, block)
    assert got_i.tolist() == [int(idx[j]) for j in order]
    assert torch.equal(got_v, val[order])
    assert counts.tolist() == np.bincount(owners, minlength=parts).tolist()


@pytest.mark.parametrize("torch_path", [False, True], ids=["C", "torch"])
@pytest.mark.parametrize("n,parts,block", [(1000, 3, 1), (1003, 5, 8), (77, 2, 64), (1, 1, 4), (0, 2, 2)])
def test_bitmap_round_trip_matches_the_reference(n, parts, block, torch_path):
    rng = np.random.default_rng(n)
    for owner in range(parts):
        cls = ref_class(n, parts, SEED, block, owner)
        idx = sorted(rng.choice(cls, len(cls) // 3, replace=False).tolist()) if cls else []
        with _path(torch_path):
            bitmap = ops.zen_bitmap_encode(torch.tensor(idx, dtype=torch.int64), n, parts, SEED, block, owner)
            back = ops.zen_bitmap_decode(bitmap, n, parts, SEED, block, owner)
            starts, counts = ops.zen_class_blocks(n, parts, SEED, block)
        assert bytes(bitmap.tolist()) == ref_bitmap(idx, cls)
        assert back.tolist() == idx
        assert zf.ZenClasses.build(n, parts, SEED, block).indices(owner).tolist() == cls
        assert int(counts[owner]) == len({i // block for i in cls})


@pytest.mark.parametrize("torch_path", [False, True], ids=["C", "torch"])
def test_bitmap_decode_rejects_malformed_bitmaps(torch_path):
    n, parts, block, owner = 1000, 3, 1, 1
    size = len(ref_class(n, parts, SEED, block, owner))
    assert size % 8, "the case needs padding bits"
    good = ops.zen_bitmap_encode(torch.tensor([], dtype=torch.int64), n, parts, SEED, block, owner)
    with _path(torch_path):
        with pytest.raises(WireFormatError):
            ops.zen_bitmap_decode(torch.zeros(good.numel() + 1, dtype=torch.uint8), n, parts, SEED, block, owner)
        bad = good.clone()
        bad[-1] = 0x80   # a padding bit (the class ends before bit 7 of the last byte)
        with pytest.raises(WireFormatError):
            ops.zen_bitmap_decode(bad, n, parts, SEED, block, owner)
        with pytest.raises(ValueError, match="class"):   # encoding an index of another class
            ops.zen_bitmap_encode(torch.tensor(ref_class(n, parts, SEED, block, 0)[:1]), n, parts, SEED, block, owner)


@pytest.mark.parametrize("torch_path", [False, True], ids=["C", "torch"])
@pytest.mark.parametrize("n", [1 << 31, (1 << 62) + 5, (1 << 63) - 1])
def test_a_short_bitmap_is_refused_within_its_own_length(torch_path, n):
    """A peer's bitmap far shorter than its class (claimed N of 2^31 .. 2^63 - 1) is refused as
    malformed, naming the bitmap, after a walk of the blocks its own bits can cover: a walk over
    all N / block blocks took 9 s at 2^31 and never ended at 2^63 - 1 (the bound below only tells a
    walk of the bitmap's length from one of N's)."""
    import time

    for nbytes in (0, 1, 3):
        start = time.perf_counter()
        with _path(torch_path), pytest.raises(WireFormatError, match="bitmap is malformed"):
            ops.zen_bitmap_decode(torch.zeros(nbytes, dtype=torch.uint8), n, 2, SEED, 1, 0)
        assert time.perf_counter() - start < 2.0, (n, nbytes)


# -- the algorithm ------------------------------------------------------------------------
def _grads(P: int, n: int, step: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(n, generator=g) for _ in range(P)]


def _ref_sum(grads: list[torch.Tensor], k: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The float32 sum, in rank order, of every rank's top-k, and every rank's residual."""
    out = torch.zeros_like(grads[0])
    residuals = []
    for g in grads:
        idx = torch.from_numpy(ref_topk_indices(g, k))
        out[idx] += g[idx]
        r = g.clone()
        r[idx] = 0
        residuals.append(r)
    return out, residuals


@pytest.mark.parametrize("form", ["auto", "index", "bitmap", "dense"])
@pytest.mark.parametrize("P", [1, 2, 3, 5, 8, 33])
def test_sum_of_the_selections_bit_for_bit(P, form):
    n, k = 3001, 61 if P < 33 else 7
    grads = _grads(P, n)
    want, residuals = _ref_sum(grads, k)

    def rank(comm):
        alg = algorithms.get("zen")(comm, pull_form=form, block=4)
        acc, out = grads[comm.rank].clone(), torch.empty(n)
        alg.reduce(acc, k, out)
        return out, acc

    for r, (out, acc) in enumerate(simulate(P, rank).results):
        assert torch.equal(out, want), (r, (out != want).nonzero()[:5].tolist())
        assert torch.equal(acc, residuals[r]), r


def test_auto_picks_the_fewest_bytes_per_message():
    n, dtype = 1 << 16, torch.float32
    assert zf.choose_form(10, 4096, n, dtype) == "index"      # 10 entries: 40 + 40 bytes beat a 512-byte bitmap
    assert zf.choose_form(800, 4096, n, dtype) == "bitmap"    # 512 + 3200 beat 3200 + 3200
    assert zf.choose_form(4000, 4096, n, dtype) == "dense"    # 16384 beat 512 + 16000
    for m in range(0, 4097, 97):
        sizes = {f: zf.pull_nbytes(f, m, 4096, n, dtype) for f in zf.PULL_FORMS}
        assert sizes[zf.choose_form(m, 4096, n, dtype)] == min(sizes.values())


def test_fused_add_error_feedback_and_half_precision_through_the_reducer():
    """SparseAllreduce (fused add) on bfloat16 for two steps: each step the float32 sum of every
    rank's top-k of residual + gradient, rounded once; what was not selected carries over (the
    DDP hook divides by P afterwards, as for every algorithm)."""
    P, n, density, steps = 4, 2000, 0.05, 2
    grads = [[g.to(torch.bfloat16) for g in _grads(P, n, 3 + s)] for s in range(steps)]
    k = sc.k_for(density, n)

    def rank(comm):
        red = sc.SparseAllreduce("zen", density, comm=comm)
        return [red(grads[s][comm.rank].clone()) for s in range(steps)]

    residual = [torch.zeros(n) for _ in range(P)]
    wants = []
    for s in range(steps):
        want = torch.zeros(n)
        for r in range(P):
            acc = residual[r] + grads[s][r].float()
            idx = torch.from_numpy(ref_topk_indices(acc, k))
            want[idx] += acc[idx]
            acc[idx] = 0
            residual[r] = acc
        wants.append(want.to(torch.bfloat16))
    for outs in simulate(P, rank).results:
        for s in range(steps):
            assert torch.equal(outs[s], wants[s]), s


def _push_and_total_received(P: int, grads: list, name: str, density: float, **options):
    """Per rank: the bytes it receives in the push round (the one ``exchange_var``: every rank's
    pairs to their owners; the range split's split round) and over the whole call."""
    def rank(comm):
        pushed = []
        exchange_var = comm.exchange_var

        def counting(sends, sources, **bound):
            got = exchange_var(sends, sources, **bound)
            pushed.append(sum(t.numel() for t in got))
            return got

        comm.exchange_var = counting
        red = sc.SparseAllreduce(name, density, comm=comm, **options)
        red(grads[comm.rank].clone())
        return pushed[0], red.last_stats["bytes_recv"]   # the first: the push (the pull's rounds follow)
    got = simulate(P, rank).results
    return np.array([r[0] for r in got], dtype=np.float64), np.array([r[1] for r in got], dtype=np.float64)


def test_hash_balances_a_hot_range_that_the_range_split_does_not():
    """Every rank's non-zeros in one contiguous eighth of the vector: with the range split one
    owner receives nearly all of the push round; with the hash every owner about the same, and
    over the whole call (push and pull) zen's receivers stay balanced too."""
    P, n, density = 8, 1 << 20, 0.005
    g = torch.Generator().manual_seed(5)
    grads = []
    for _ in range(P):
        x = torch.zeros(n)
        x[n // 2:n // 2 + n // 8] = torch.randn(n // 8, generator=g)
        grads.append(x)
    zen_push, zen_total = _push_and_total_received(P, grads, "zen", density)
    split_push, _ = _push_and_total_received(P, grads, "sparcml_split_allgather", density)
    assert zen_push.max() <= 1.2 * zen_push.mean(), zen_push.tolist()
    assert zen_total.max() <= 1.2 * zen_total.mean(), zen_total.tolist()
    assert split_push.max() >= 4.0 * split_push.mean(), split_push.tolist()


def test_auto_block_is_the_largest_that_leaves_128_blocks_per_owner():
    """block="auto": the largest power of two <= 64 with k >= 128 P block, else 1."""
    ref = lambda k, p: max([1] + [b for b in (1, 2, 4, 8, 16, 32, 64) if k >= 128 * p * b])  # noqa: E731
    from sparsecomm.algorithms.zen import auto_block
    for k, p in [(150_000, 8), (15_000, 8), (2048, 8), (2047, 8), (69, 8), (65536, 8), (65535, 8), (10**9, 1024),
                 (1, 1), (0, 3), (128 * 33 * 16, 33)]:
        assert auto_block(k, p) == ref(k, p), (k, p)


def test_auto_block_balances_a_short_hot_run_that_blocks_of_64_do_not():
    """Every rank selects the same contiguous run of 2048 indices (k = 2048, P = 8): blocks of
    64 deal its 32 blocks to 8 owners, and the busiest receives far more than the mean; the
    automatic block (2 here) deals 1024 blocks and stays balanced."""
    P, n = 8, 1 << 16
    k = 2048
    grads = []
    for r in range(P):
        x = torch.zeros(n)
        x[20_000:20_000 + k] = torch.arange(1, k + 1, dtype=torch.float32) + r
        grads.append(x)
    density = k / n
    coarse, _ = _push_and_total_received(P, grads, "zen", density, block=64)
    auto, auto_total = _push_and_total_received(P, grads, "zen", density)
    assert coarse.max() >= 1.5 * coarse.mean(), coarse.tolist()
    assert auto.max() <= 1.2 * auto.mean(), auto.tolist()
    assert auto_total.max() <= 1.2 * auto_total.mean(), auto_total.tolist()


# -- malformed messages -------------------------------------------------------------------
N, P, BLOCK = 2000, 3, 4


def _classes():
    return zf.ZenClasses.build(N, P, SEED, BLOCK)


def _pairs(owner: int, m: int):
    cls = _classes().indices(owner)
    idx = cls[torch.linspace(0, cls.numel() - 1, m).long().unique()]
    return idx, torch.arange(1, idx.numel() + 1, dtype=torch.float32)


@pytest.mark.parametrize("form", zf.PULL_FORMS)
def test_pull_messages_round_trip_and_reject_corruption(form):
    classes, owner = _classes(), 1
    idx, val = _pairs(owner, 40)
    msg = zf.encode_pull(idx, val, form, classes, owner)
    assert msg.numel() % 8 == 0 and msg.numel() == zf.pull_nbytes(form, idx.numel(), classes.sizes[owner], N,
                                                                  torch.float32)
    got_i, got_v = zf.decode_pull(msg, classes=classes, value_dtype=torch.float32, receiver=0, sender=owner)
    dense = torch.zeros(N)
    dense[got_i.long()] = got_v
    want = torch.zeros(N)
    want[idx] = val
    assert torch.equal(dense, want)
    decode = lambda m, **kw: zf.decode_pull(m, **{"classes": classes, "value_dtype": torch.float32,  # noqa: E731
                                                  "receiver": 0, "sender": owner, **kw})
    with pytest.raises(WireFormatError):      # another sender's class
        decode(msg, sender=2)
    with pytest.raises(WireFormatError):      # truncated
        decode(msg[:-8])
    with pytest.raises(WireFormatError):      # a kind this message cannot have
        bad = msg.clone()
        bad[6] = 4
        decode(bad)
    bad = torch.cat([msg, torch.zeros(8, dtype=torch.uint8)])
    with pytest.raises(WireFormatError):      # longer than its header says
        decode(bad)


def test_pull_rejects_indices_and_bits_outside_the_class():
    classes = _classes()
    other = classes.indices(0)[:3]
    msg = zf.encode_pull(other, torch.ones(3), "index", classes, 0)
    msg[12] = 1   # the same message claiming to come from owner 1: indices of class 0
    with pytest.raises(WireFormatError, match="hash class"):
        zf.decode_pull(msg, classes=classes, value_dtype=torch.float32, receiver=0, sender=1)
    idx, val = _pairs(1, 5)
    msg = zf.encode_pull(idx, val, "bitmap", classes, 1)
    used = (classes.sizes[1] + 7) // 8
    assert classes.sizes[1] % 8
    msg[32 + used - 1] |= 0x80   # a padding bit past the class
    with pytest.raises(WireFormatError):
        zf.decode_pull(msg, classes=classes, value_dtype=torch.float32, receiver=0, sender=1)
    msg = zf.encode_pull(idx, val, "bitmap", classes, 1)
    msg[32] ^= 0x01 if not int(msg[32]) & 1 else 0x02   # one bit more or less than the header's count
    with pytest.raises(WireFormatError, match="bits"):
        zf.decode_pull(msg, classes=classes, value_dtype=torch.float32, receiver=0, sender=1)


@pytest.mark.parametrize("form", zf.PULL_FORMS)
def test_a_pull_block_left_unaligned_by_a_coded_block_decodes(form):
    """A codec's index-form message has whatever length the codec makes, so the all-gather's
    next block can start at any byte; the receiver still decodes it (copied to align it)."""
    classes = _classes()
    idx, val = _pairs(1, 40)
    msg = zf.encode_pull(idx, val, form, classes, 1)
    shifted = torch.cat([torch.zeros(3, dtype=torch.uint8), msg])[3:]   # after a block 3 bytes past a multiple of 8
    assert shifted.data_ptr() % 8
    i, v = zf.decode_pull(shifted, classes=classes, value_dtype=torch.float32, receiver=0, sender=1)
    if form == "dense":
        i, v = i[v != 0], v[v != 0]
    assert torch.equal(i.to(torch.int64), idx) and torch.equal(v, val)


def test_push_rejects_pairs_of_another_owner():
    classes = _classes()
    idx, val = _pairs(2, 6)
    msg = encode_coo(idx, val, N, 0)   # a push message is a COO message
    zf.decode_push(msg, classes=classes, value_dtype=torch.float32, receiver=2, sender=0)
    with pytest.raises(WireFormatError, match="hash class"):
        zf.decode_push(msg, classes=classes, value_dtype=torch.float32, receiver=1, sender=0)


def test_a_malformed_push_fails_the_call_on_the_receiver():
    """End to end: rank 0's push messages name another sender in their header; the owners
    receiving them raise WireFormatError, and the call fails."""
    def rank(comm):
        alg = algorithms.get("zen")(comm, block=1)
        real = alg.codec.encode   # the push messages' encoder (the pull's plain forms do not use it)

        def corrupt(indices, values, n, sender):
            msg, sent = real(indices, values, n, sender)
            if sender == 0:
                msg = msg.clone()
                msg[12] = 2   # the header's sender field
            return msg, sent

        alg.codec.encode = corrupt
        acc = _grads(P, N)[comm.rank].clone()
        alg.reduce(acc, 200, torch.empty(N))

    with pytest.raises(WireFormatError):
        simulate(P, rank)
