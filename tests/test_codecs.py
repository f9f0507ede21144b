"""The COO codec layer (sparsecomm.formats.codec) under every algorithm that uses it.

For every algorithm x codec combination, on simulated P up to 16 and gloo P = 1..6:
* ``index_codec="delta_binary"`` alone: outputs and residuals bit-identical to the run
  without codecs on the same gradients (lossless: only bytes change), and fewer bytes;
* ``value_codec="skcompress"`` (with or without the index codec): the result is identical on
  every rank and conservation holds, sum_r (g_r + e_r) == out + sum_r e'_r (float64 sums,
  float32 tolerance), and outputs stay finite;
plus the handshake on differing codec options (the same ValueError on every rank), the
codec's validation of what it receives (WireFormatError naming both ranks), and the
options' validation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.errors import WireFormatError
from sparsecomm.formats import CooCodec
from sparsecomm.testing import spawn

from _reference import make_gradients

STEPS = 3
INDEX = {"index_codec": "delta_binary"}
VALUE = {"value_codec": "skcompress"}
BOTH = {"index_codec": "delta_binary", "value_codec": "skcompress"}

# (algorithm, its own options) using the codecs
ALGORITHMS = [
    ("topka", {}),
    ("gtopk", {}),
    ("spardl", {}),
    ("spardl", {"teams": 2, "sag": "bruck"}),
    ("spardl", {"teams": 4, "sag": "recursive"}),
    ("spardl", {"teams": 1}),
    ("oktopk", {}),
    ("oktopk", {"tau": 2, "tau_prime": 2}),
    # the sparcml family: sparse streams coded, dense phases as they were
    ("sparcml_recursive_double", {}),
    ("sparcml_split_allgather", {}),
    ("topkdsa", {}),
    ("topkdsa", {"quantize_bits": 8}),
    ("sparcml", {}),
    # zen: the push messages and the pull's index form coded, its bitmap and dense forms as they were
    ("zen", {}),
    ("zen", {"pull_form": "index", "block": 1}),
]
SPARCML_FAMILY = ("sparcml_recursive_double", "sparcml_split_allgather", "topkdsa", "sparcml")


def _history(comm, algorithm, density, grads_by_step, options):
    reducer = sc.SparseAllreduce(algorithm, density, comm=comm, **options)
    hist = []
    for grads in grads_by_step:
        out = reducer(grads[comm.rank].clone())
        hist.append((out.clone(), reducer.residual.clone(), reducer.last_stats["bytes_sent"]))
    return hist


def _grads(size, n, dtype, pattern):
    return [make_gradients(pattern, n, size, step, dtype) for step in range(STEPS)]


def _applicable(options, size):
    teams = options.get("teams")
    return teams is None or (size % teams == 0 and (options.get("sag") != "recursive" or teams & (teams - 1) == 0))


def check_lossy(results, grads_by_step, size):
    residual_before = [torch.zeros_like(grads_by_step[0][0], dtype=torch.float64) for _ in range(size)]
    for step, grads in enumerate(grads_by_step):
        outs = [results[r][step][0] for r in range(size)]
        for r in range(1, size):
            assert torch.equal(outs[r], outs[0]), f"step {step}: rank {r} differs from rank 0"
        assert torch.isfinite(outs[0]).all()
        total_in = sum(grads[r].double() + residual_before[r] for r in range(size))
        residual_after = [results[r][step][1].double() for r in range(size)]
        total_out = outs[0].double() + sum(residual_after)
        scale = max(1.0, float(total_in.abs().max()))
        np.testing.assert_allclose(total_out.numpy(), total_in.numpy(), rtol=0, atol=2e-5 * scale * size,
                                   err_msg=f"conservation, step {step}")
        residual_before = residual_after


def check_index_codec_identical(plain, coded, size):
    for r in range(size):
        for step in range(STEPS):
            assert torch.equal(coded[r][step][0], plain[r][step][0]), (r, step)
            assert torch.equal(coded[r][step][1], plain[r][step][1]), (r, step)


SIM = [  # (P, N, density, dtype, pattern)
    (1, 1025, 0.05, torch.float32, "random"),
    (2, 3001, 0.02, torch.float64, "overlap"),
    (3, 1025, 0.1, torch.float32, "disjoint"),
    (4, 4097, 0.01, torch.float32, "random"),
    (6, 2053, 0.05, torch.float32, "overlap"),
    (8, 1025, 1.0, torch.float32, "random"),
    (5, 1025, 0.02, torch.float32, "ties"),
    (4, 1025, 0.02, torch.float32, "zeros"),
    (16, 8193, 0.01, torch.float32, "random"),
]


@pytest.mark.parametrize("size,n,density,dtype,pattern", SIM)
@pytest.mark.parametrize("algorithm,options", ALGORITHMS, ids=[f"{a}-{o}" for a, o in ALGORITHMS])
def test_codecs_simulated(algorithm, options, size, n, density, dtype, pattern):
    if not _applicable(options, size):
        pytest.skip("teams do not fit P")
    grads = _grads(size, n, dtype, pattern)

    def run(extra):
        return simulate(size, lambda comm: _history(comm, algorithm, density, grads, {**options, **extra})).results

    plain, index, value, both = run({}), run(INDEX), run(VALUE), run(BOTH)
    check_index_codec_identical(plain, index, size)
    # small messages (spardl: k/P per block; oktopk: about k/P per region; zen: about k/P per
    # owner): the size round and the codec's tables cost more than the keys save
    per_message = density * n / size if algorithm in ("oktopk", "zen") else density * n
    if size > 1 and per_message >= 40 and algorithm != "spardl" and algorithm not in SPARCML_FAMILY:
        assert sum(h[2] for h in index[0]) < sum(h[2] for h in plain[0]), "delta-binary keys must save bytes"
    check_lossy(value, grads, size)
    check_lossy(both, grads, size)


def _gloo_rank(rank, world_size, cases):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    out = []
    for algorithm, options, density, grads in cases:
        hist = _history(comm, algorithm, density, grads, options)
        out.append([(o.numpy(), r.numpy(), b) for o, r, b in hist])
    return out


@pytest.mark.parametrize("size", range(1, 7))
def test_codecs_on_gloo_ranks(size):
    n, density = 2053, 0.03
    grads = _grads(size, n, torch.float32, "overlap")
    cases = [(alg, {**opts, **codec}, density, grads) for alg, opts in ALGORITHMS if _applicable(opts, size)
             for codec in ({}, INDEX, BOTH)]
    cases += [("skcompress", {"topology": t}, density, grads) for t in ("allgather", "ps")]
    runs = spawn(_gloo_rank, size, cases, timeout=240)
    as_torch = [[[(torch.from_numpy(o), torch.from_numpy(r), b) for o, r, b in runs[rank][c]] for rank in range(size)]
                for c in range(len(cases))]
    for c in range(0, len(cases) - 2, 3):
        check_index_codec_identical(as_torch[c], as_torch[c + 1], size)
        check_lossy(as_torch[c + 2], grads, size)
    check_lossy(as_torch[-2], grads, size)
    check_lossy(as_torch[-1], grads, size)


@pytest.mark.parametrize("algorithm", ["topka", "sparcml_recursive_double", "sparcml_split_allgather", "topkdsa",
                                       "sparcml"])
def test_handshake_rejects_differing_codec_options(algorithm):
    def rank(comm):
        options = VALUE if comm.rank == 1 else {}
        reducer = sc.SparseAllreduce(algorithm, 0.1, comm=comm, **options)
        try:
            reducer(torch.randn(100))
        except ValueError as exc:
            return str(exc)
        return None

    errors = simulate(3, rank).results
    assert all(e is not None for e in errors), errors
    assert len({e.split(": ", 1)[1] for e in errors}) == 1, errors  # the same error, after "rank r: "
    assert "value_codec='skcompress'" in errors[0] and "value_codec='none'" in errors[0]


@pytest.mark.parametrize("algorithm", ["topka", "gtopk", "spardl", "oktopk", "skcompress", *SPARCML_FAMILY])
def test_coded_body_revision_reaches_the_handshake(algorithm):
    """An algorithm sending coded COO bodies names their layout revision in its wire_revision
    (the handshake's algorithm field), the revision every body carries in its byte 2; plain
    COO messages add nothing."""
    from sparsecomm.algorithms.base import get

    body = sc.ops.skcompress_encode(torch.tensor([3, 9]), torch.tensor([1.0, -2.0]), 10)
    assert int(body[2]) == sc.ops.SKC_REVISION
    revision = f"coo-coded-r{sc.ops.SKC_REVISION}"
    options = {} if algorithm == "skcompress" else INDEX
    coded = get(algorithm)(None, **options)
    assert coded.wire_revision.split("/")[-1] == revision, coded.wire_revision
    if algorithm != "skcompress":
        assert revision not in get(algorithm)(None).wire_revision


@pytest.mark.parametrize("option,value", [("index_codec", "zstd"), ("value_codec", "qsgd"), ("q", 3), ("q", 2.0),
                                          ("s", 0), ("t", 0.0), ("t", float("nan")), ("r", 0), ("r", 200),
                                          ("m", 3), ("m", True), ("prefix", "none"), ("topology", "ring")])
@pytest.mark.parametrize("algorithm", ["topka", "gtopk", "spardl", "oktopk", "skcompress", *SPARCML_FAMILY])
def test_invalid_codec_options(algorithm, option, value):
    cls = sc.algorithms.get(algorithm)
    if option not in cls.option_defaults:
        with pytest.raises(ValueError, match=rf"does not take option\(s\) {option}"):
            cls(None, **{option: value})
        return
    with pytest.raises(ValueError, match=rf"^{algorithm}: {option} must be .*got {value!r}"):
        cls(None, **{option: value})


# -- the skcompress algorithm ----------------------------------------------------------------

@pytest.mark.parametrize("size,n,density,dtype,pattern", SIM)
@pytest.mark.parametrize("topology", ["allgather", "ps"])
def test_skcompress_simulated(topology, size, n, density, dtype, pattern):
    grads = _grads(size, n, dtype, pattern)
    res = simulate(size, lambda comm: _history(comm, "skcompress", density, grads, {"topology": topology})).results
    check_lossy(res, grads, size)
    if topology == "allgather":  # topka's procedure with both codecs: the same numbers
        ref = simulate(size, lambda comm: _history(comm, "topka", density, grads, BOTH)).results
        for r in range(size):
            for step in range(STEPS):
                assert torch.equal(res[r][step][0], ref[r][step][0]) and torch.equal(res[r][step][1], ref[r][step][1])


def test_skcompress_options_reach_the_codec():
    grads = _grads(4, 20000, torch.float32, "random")
    small = simulate(4, lambda comm: _history(comm, "skcompress", 0.05, grads, {"q": 16, "t": 0.1})).results
    large = simulate(4, lambda comm: _history(comm, "skcompress", 0.05, grads, {"q": 1024, "t": 2.0, "s": 4})).results
    assert sum(h[2] for h in small[0]) < sum(h[2] for h in large[0])
    # finer buckets and a larger sketch: the result is closer to the exact sum of the selections
    exact = simulate(4, lambda comm: _history(comm, "topka", 0.05, grads, {})).results
    err = [float((run[0][0][0] - exact[0][0][0]).norm()) for run in (small, large)]
    assert err[1] < err[0]


# -- the codec's own validation of received messages ---------------------------------------

def _message(codec_options, n=1000, count=40, sender=2, dtype=torch.float32):
    g = torch.Generator().manual_seed(count)
    idx = torch.sort(torch.randperm(n, generator=g)[:count]).values
    val = torch.randn(count, generator=g, dtype=dtype)
    codec = CooCodec({**sc.formats.CODEC_OPTION_DEFAULTS, **codec_options})
    message, sent = codec.encode(idx, val, n, sender)
    return codec, idx, val, message, sent


@pytest.mark.parametrize("options", [{}, INDEX, VALUE, BOTH])
def test_codec_round_trip_and_sent_values(options):
    codec, idx, val, message, sent = _message(options)
    d_idx, d_val = codec.decode(message, n=1000, value_dtype=torch.float32, receiver=0, sender=2, count=40)
    assert torch.equal(d_idx.long(), idx)
    assert torch.equal(d_val, sent)  # what the sender keeps is exactly what receivers decode
    if codec.lossless:
        assert torch.equal(sent, val)
    else:
        assert torch.all((sent >= 0) == (val >= 0) | (sent == 0))


@pytest.mark.parametrize("mine,theirs", [(INDEX, {}), ({}, INDEX), (VALUE, BOTH), (BOTH, INDEX)])
def test_codec_rejects_other_codecs_and_bad_headers(mine, theirs):
    _, _, _, message, _ = _message(theirs)
    codec = CooCodec({**sc.formats.CODEC_OPTION_DEFAULTS, **mine})
    with pytest.raises(WireFormatError, match="rank 0 received from rank 2"):
        codec.decode(message, n=1000, value_dtype=torch.float32, receiver=0, sender=2, count=40)


@pytest.mark.parametrize("options", [INDEX, VALUE, BOTH])
def test_codec_malformed_messages(options):
    codec, _, _, message, _ = _message(options)
    kw = dict(n=1000, value_dtype=torch.float32, receiver=0, sender=2)
    with pytest.raises(WireFormatError, match="sender differs"):
        codec.decode(message, **{**kw, "sender": 3})
    with pytest.raises(WireFormatError, match="count"):
        codec.decode(message, **kw, count=41)
    with pytest.raises(WireFormatError, match="rank 0 received from rank 2 a coded COO message"):
        codec.decode(message[:-1].clone(), **kw)
    bad = message.clone()
    bad[33] = 7  # the value codec byte of the body
    with pytest.raises(WireFormatError, match="codec"):
        codec.decode(bad, **kw)


def test_benchmark_and_example_labels_name_codecs():
    from sparsecomm.bench.collectives import _variant

    assert _variant("topka") == ("topka", {})
    assert _variant("spardl+delta_binary+skcompress") == ("spardl", BOTH)
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        _variant("topka+zstd")


@pytest.mark.parametrize("codec", [INDEX, BOTH], ids=["index", "both"])
def test_oktopk_volume_counts_entries_with_codecs(codec):
    """Ok-Topk's 6k(P-1)/P bound is in entries: the codecs change bytes, not entries (the index
    codec not even the selection, so every phase's count equals the plain run's)."""
    size, n, density = 4, 4097, 0.03
    grads = _grads(size, n, torch.float32, "overlap")

    def run(extra):
        def rank(comm):
            reducer = sc.SparseAllreduce("oktopk", density, comm=comm, tau=2, tau_prime=2, **extra)
            volumes = []
            for step in range(STEPS):
                reducer(grads[step][comm.rank].clone())
                volumes.append(dict(reducer.algorithm.last_volume))
            return volumes
        return simulate(size, rank).results

    plain, coded = run({}), run(codec)
    for r in range(size):
        for step in range(STEPS):
            v = coded[r][step]
            assert v["entries"] == v["split"] + v["balance"] + v["allgather"] <= v["bound"], (r, step, v)
            if codec is INDEX:
                assert v == plain[r][step], (r, step)


# -- the sparcml family: coded sparse streams ---------------------------------------------

@pytest.mark.parametrize("algorithm", ["sparcml_recursive_double", "sparcml_split_allgather", "topkdsa"])
def test_sparcml_family_index_codec_saves_bytes(algorithm):
    """Sparse phases (k = 1% of N, far below delta) travel with delta-binary keys: fewer bytes,
    the same results (checked bit for bit in the tables above)."""
    grads = _grads(4, 100_000, torch.float32, "random")

    def run(extra):
        return simulate(4, lambda comm: _history(comm, algorithm, 0.01, grads, extra)).results

    plain, index, both = run({}), run(INDEX), run(BOTH)
    sent = [sum(h[2] for h in res[0]) for res in (plain, index, both)]
    assert sent[1] < sent[0] and sent[2] < sent[0], sent
    if algorithm != "topkdsa":  # topkdsa's bytes are mostly its dense all-gather, which no codec touches
        assert sent[2] < sent[1], sent


def test_sparcml_passes_codec_options_to_its_choice():
    def rank(comm):
        reducer = sc.SparseAllreduce("sparcml", 0.01, comm=comm, **BOTH)
        reducer(torch.randn(20_000, generator=torch.Generator().manual_seed(comm.rank)))
        inner = reducer.algorithm._algs[reducer.algorithm.last_choice]
        return inner.codec.index_codec, inner.codec.value_codec, reducer.algorithm.lossless

    assert simulate(4, rank).results == [("delta_binary", "skcompress", False)] * 4


def _stream(count=30, n=1000, offset=500, sender=2):
    from sparsecomm.algorithms._sparse_stream import SparseStream

    g = torch.Generator().manual_seed(count)
    idx = torch.sort(torch.randperm(n, generator=g)[:count]).values
    return SparseStream.sparse(idx, torch.randn(count, generator=g), n, offset)


def _stream_codec(options):
    return CooCodec({**sc.formats.CODEC_OPTION_DEFAULTS, **options})


@pytest.mark.parametrize("options", [INDEX, VALUE, BOTH])
def test_coded_stream_round_trip(options):
    from sparsecomm.algorithms._sparse_stream import decode_sparse_stream, encode_sparse_stream

    codec = _stream_codec(options)
    stream = _stream()
    message, sent = encode_sparse_stream(stream, 2, codec)
    assert int(message[6]) == int(sc.formats.Kind.COO_CODED)
    # one byte in front: a block that follows a coded message of odd length in a gathered buffer
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), message])[1:]
    for payload in (message, shifted):
        got = decode_sparse_stream(payload, n=1000, offset=500, value_dtype=torch.float32, receiver=0, sender=2,
                                   codec=codec)
        assert (got.n, got.offset, got.is_dense) == (1000, 500, False)
        assert torch.equal(got.indices.long(), stream.indices.long()) and torch.equal(got.values, sent.values)
    if codec.lossless:
        assert sent is stream
    # a dense stream is never coded: the plain DENSE message, accepted with or without codecs
    dense = stream.densified()
    message, sent = encode_sparse_stream(dense, 2, codec)
    assert sent is dense and int(message[6]) == int(sc.formats.Kind.DENSE)
    got = decode_sparse_stream(message, n=1000, offset=500, value_dtype=torch.float32, receiver=0, sender=2,
                               codec=codec)
    assert got.is_dense and torch.equal(got.values, dense.values)


def _coded_cases():
    from sparsecomm.algorithms._sparse_stream import encode_sparse_stream
    from sparsecomm.formats.stream import encode_stream

    both = _stream_codec(BOTH)
    coded = encode_sparse_stream(_stream(), 2, both)[0]
    kw = dict(n=1000, offset=500, value_dtype=torch.float32, receiver=0, sender=2)
    # 600 items, past delta(1000) = 500: a sender would have sent the range dense
    idx = torch.sort(torch.randperm(1000, generator=torch.Generator().manual_seed(5))[:600]).values
    big = both.encode(idx, torch.randn(600), 1000, 2)[0]
    truncated = coded[:-1].clone()
    reserved = coded.clone()
    reserved[9] = 1
    return [
        ("coded where plain expected", coded, None, kw, "kind"),
        ("plain sparse where coded expected", encode_stream(_stream(), 2), both, kw, "plain sparse stream"),
        ("other codecs", coded, _stream_codec(INDEX), kw, "codec"),
        ("past delta", big, both, kw, "past delta"),
        ("range length", coded, both, {**kw, "n": 999}, "N|n"),
        ("sender", coded, both, {**kw, "sender": 3}, "sender"),
        ("truncated", truncated, both, kw, "coded COO message"),
        ("reserved header byte", reserved, both, kw, "reserved"),
        ("header cut", coded[:20].clone(), both, kw, "."),
    ]


@pytest.mark.parametrize("name,payload,codec,kw,match", _coded_cases(), ids=[c[0] for c in _coded_cases()])
def test_coded_stream_malformed(name, payload, codec, kw, match):
    from sparsecomm.algorithms._sparse_stream import decode_sparse_stream

    with pytest.raises(WireFormatError, match=match) as info:
        decode_sparse_stream(payload, codec=codec, **kw)
    assert "rank 0 received from rank" in str(info.value), str(info.value)


@pytest.mark.parametrize("options", [INDEX, BOTH])
@pytest.mark.parametrize("dtype,delta", [(torch.float32, 500), (torch.float64, 666)])
def test_coded_stream_of_exactly_delta_items(options, dtype, delta):
    """A sparse range may hold up to delta = n * isize // (4 + isize) items (4-byte indices at
    n = 1000: 500 in float32, 666 in float64). A coded stream of delta - 1 or exactly delta
    items is received; delta + 1 is refused as a range the sender should have sent dense."""
    from sparsecomm.algorithms._sparse_stream import SparseStream, decode_sparse_stream, encode_sparse_stream

    n, offset = 1000, 500
    codec = _stream_codec(options)
    kw = dict(n=n, offset=offset, value_dtype=dtype, receiver=0, sender=2)
    for count in (delta - 1, delta, delta + 1):
        g = torch.Generator().manual_seed(count)
        idx = torch.sort(torch.randperm(n, generator=g)[:count]).values
        vals = torch.randn(count, generator=g, dtype=dtype)
        if count <= delta:
            message, sent = encode_sparse_stream(SparseStream.sparse(idx, vals, n, offset), 2, codec)
            assert int(message[6]) == int(sc.formats.Kind.COO_CODED)
            got = decode_sparse_stream(message, codec=codec, **kw)
            assert (got.n, got.offset, got.is_dense) == (n, offset, False)
            assert torch.equal(got.indices.long(), idx) and torch.equal(got.values, sent.values)
            if codec.lossless:
                assert torch.equal(got.values, vals)
        else:
            message = codec.encode(idx, vals, n, 2)[0]   # what a wrong sender would send
            with pytest.raises(WireFormatError, match="past delta"):
                decode_sparse_stream(message, codec=codec, **kw)


# -- summation order and entry counts (found by the mutation pass: nothing pinned them) -----

def _shared_support_grads(size, n, k, seed=5):
    """Every rank's gradient has the same k non-zeros (so its top-k is exactly them), with
    magnitudes spread over 8 decades and random signs: float32 sums depend on their order."""
    gen = torch.Generator().manual_seed(seed)
    support = torch.randperm(n, generator=gen)[:k]
    grads = []
    for _ in range(size):
        g = torch.zeros(n)
        mag = 10.0 ** (torch.rand(k, generator=gen) * 8 - 4)
        sign = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0)
        g[support] = mag * sign
        grads.append(g)
    return grads


@pytest.mark.parametrize("options", [{}, INDEX], ids=["plain", "index_codec"])
def test_topka_adds_the_ranks_in_rank_order(options):
    """topka: every rank decodes the same P messages and adds them in rank order, element-wise
    ((x_0 + x_1) + x_2) + ... in float32, so the result is that sum bit for bit (the reference
    here); last_stats' nnz_out counts the merged entries."""
    size, n, k = 4, 4000, 400
    grads = _shared_support_grads(size, n, k)
    want = grads[0].clone()
    for g in grads[1:]:
        want = want + g
    assert not torch.equal(want, ((grads[3] + grads[2]) + grads[1]) + grads[0]), "order must matter here"

    def run(comm):
        red = sc.SparseAllreduce("topka", k / n, comm=comm, **options)
        return red(grads[comm.rank].clone()), dict(red.last_stats)
    for out, stats in simulate(size, run).results:
        assert torch.equal(out, want)
        assert stats["nnz_out"] == k


@pytest.mark.parametrize("size", [3, 4])
def test_gtopk_result_holds_k_entries(size):
    """gTop-k keeps exactly k entries of the sum (k <= the union): k non-zeros in the result
    on every rank, and nnz_out says k."""
    n, density = 3000, 0.02
    k = 60
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(size)]

    def run(comm):
        red = sc.SparseAllreduce("gtopk", density, comm=comm)
        return red(grads[comm.rank].clone()), dict(red.last_stats)
    for out, stats in simulate(size, run).results:
        assert int(torch.count_nonzero(out)) == k
        assert stats["nnz_out"] == k


@pytest.mark.parametrize("topology", ["allgather", "ps"])
def test_skcompress_nnz_out_counts_the_result(topology):
    """nnz_out is the number of entries of the reduced result (the union of the selections),
    not of this rank's selection: with random values none decodes to zero, so it is the
    result's non-zero count on every rank."""
    size, n, density = 3, 2000, 0.02
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(size)]

    def run(comm):
        red = sc.SparseAllreduce("skcompress", density, comm=comm, topology=topology)
        return red(grads[comm.rank].clone()), dict(red.last_stats)
    for out, stats in simulate(size, run).results:
        assert stats["nnz_out"] == int(torch.count_nonzero(out)) > 40
