"""Decoders of received messages (sparsecomm.formats) validate in C (csrc/cpu/wire.c):
one malformed message per field, each raising WireFormatError with both ranks, the field
and the values; full index validation (not first/last only) including the parallel path;
device payloads; the fuzz corpus writer agrees with the Python encoders."""

from __future__ import annotations

import importlib.util
import os
import struct

import pytest
import torch

from sparsecomm.errors import WireFormatError
from sparsecomm.formats import Kind, check_header, decode_coo, encode_coo, pack_header
from sparsecomm.formats.stream import (StreamRange, decode_qsgd, decode_stream, encode_qsgd, encode_stream,
                                       qsgd_nbytes)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _set(msg: torch.Tensor, pos: int, data: bytes) -> torch.Tensor:
    out = msg.clone()
    out[pos:pos + len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return out


def _coo(idx, vals=None, n=10, sender=3, dtype=torch.float32):
    vals = [1.0] * len(idx) if vals is None else vals
    return encode_coo(torch.tensor(idx, dtype=torch.int64), torch.tensor(vals, dtype=dtype), n, sender)


GOOD = [1, 5, 9]


# (id, message, decode kwargs, regex the WireFormatError message must match)
COO_CASES = [
    ("magic", _set(_coo(GOOD), 0, b"XPCM"), {},
     r"rank 0 received from rank 3 a COO message without the sparsecomm magic \(got 0x4d435058\)"),
    ("version", _set(_coo(GOOD), 4, struct.pack("<H", 2)), {}, r"format version 2, this rank speaks 1"),
    ("kind", _set(_coo(GOOD), 6, b"\x02"), {}, r"kind differs: rank 3 sent DENSE, rank 0 expected COO"),
    ("kind-unknown", _set(_coo(GOOD), 6, b"\x09"), {}, r"kind differs: rank 3 sent 9, rank 0 expected COO"),
    ("value_dtype", _coo(GOOD), {"value_dtype": torch.float64},
     r"value_dtype differs: rank 3 sent torch.float32, rank 0 expected torch.float64"),
    ("value_dtype-unknown", _set(_coo(GOOD), 7, b"\x63"), {},
     r"value_dtype differs: rank 3 sent None, rank 0 expected torch.float32"),
    ("index_dtype", _set(_coo(GOOD), 8, b"\x06"), {},
     r"index_dtype differs: rank 3 sent torch.int64, rank 0 expected torch.int32"),
    ("reserved", _set(_coo(GOOD), 10, b"\x01"), {}, r"reserved header byte 10 is 1, must be 0"),
    ("sender", _coo(GOOD), {"sender": 2}, r"rank 0 received from rank 2 .*sender differs: rank 2 sent 3, "
                                          r"rank 0 expected 2"),
    ("n", _coo(GOOD), {"n": 11}, r"n differs: rank 3 sent 10, rank 0 expected 11"),
    ("n-huge", _set(_coo(GOOD), 16, struct.pack("<Q", 2**64 - 1)), {},
     r"n differs: rank 3 sent 18446744073709551615, rank 0 expected 10"),
    ("count", _coo(GOOD), {"count": 4}, r"count differs: rank 3 sent 3, rank 0 expected 4"),
    ("count-past-n", _set(_coo(GOOD), 24, struct.pack("<Q", 11)), {}, r"count 11 is more than N = 10"),
    ("size-short", _coo(GOOD)[:-1], {}, r"of 59 bytes; its header announces 3 entries, i.e. 60 bytes"),
    ("size-long", torch.cat([_coo(GOOD), torch.zeros(4, dtype=torch.uint8)]), {},
     r"of 64 bytes; its header announces 3 entries, i.e. 60 bytes"),
    ("size-header", _coo(GOOD)[:10], {}, r"of 10 bytes, shorter than its 32-byte fixed part"),
    ("size-huge-count", _set(_coo([], n=2**62), 24, struct.pack("<Q", 2**61)), {"n": 2**62},
     r"header announces 2305843009213693952 entries, i\.e\. more bytes than any message can hold"),
    ("index_order-repeat", _coo([1, 5, 5]), {},
     r"indices must be strictly ascending, but index \[2\] = 5 follows index \[1\] = 5"),
    ("index_order-unsorted", _coo([5, 1, 9]), {}, r"index \[1\] = 1 follows index \[0\] = 5"),
    ("index_range-n", _coo([1, 5, 10]), {}, r"index \[2\] = 10 is outside \[0, 10\)"),
    ("index_range-negative", _coo([-1, 5, 9]), {}, r"index \[0\] = -1 is outside \[0, 10\)"),
    ("padding", _set(_coo(GOOD), 44, b"\x01"), {}, r"padding byte 44 is 0x01, must be 0"),
]


@pytest.mark.parametrize("msg,kwargs,pattern", [c[1:] for c in COO_CASES], ids=[c[0] for c in COO_CASES])
def test_decode_coo_rejects(msg, kwargs, pattern):
    args = dict(n=10, value_dtype=torch.float32, receiver=0, sender=3)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        decode_coo(msg, **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [10, 2**31 + 7])
def test_decode_coo_roundtrip(dtype, n):
    idx = [0, 3, 4, n - 1]
    msg = _coo(idx, [1.0, -2.0, 3.0, 4.0], n=n, dtype=dtype)
    got_i, got_v = decode_coo(msg, n=n, value_dtype=dtype, receiver=0, sender=3, count=4)
    assert got_i.dtype == (torch.int32 if n < 2**31 else torch.int64)
    assert got_i.tolist() == idx and got_v.dtype == dtype and got_v.tolist() == [1.0, -2.0, 3.0, 4.0]
    assert got_v.data_ptr() > msg.data_ptr()  # views, no copy
    empty_i, empty_v = decode_coo(_coo([], n=n, dtype=dtype), n=n, value_dtype=dtype, receiver=0, sender=3)
    assert empty_i.numel() == 0 and empty_v.numel() == 0


@pytest.mark.parametrize("where", [1, 400_000, 1_499_999])
def test_decode_coo_checks_every_index(where):
    """Order and range in full (first and last index fine, one bad in the middle), also on
    the parallel path (> 2^18 entries)."""
    n = 3_000_000
    idx = torch.arange(0, n, 2, dtype=torch.int64)
    bad = idx.clone()
    bad[where] = bad[where - 1]
    with pytest.raises(WireFormatError, match=rf"index \[{where}\] = {int(bad[where])} follows"):
        decode_coo(encode_coo(bad, torch.ones(bad.numel()), n, 1), n=n, value_dtype=torch.float32, receiver=0,
                   sender=1)
    bad = idx.clone()
    bad[where] = n + 5
    bad[where + 1:] = n + 6  # would also be out of order: the range at the first position wins
    with pytest.raises(WireFormatError, match=rf"index \[{where}\] = {n + 5} is outside \[0, {n}\)"):
        decode_coo(encode_coo(bad.to(torch.int32), torch.ones(bad.numel()), n, 1), n=n, value_dtype=torch.float32,
                   receiver=0, sender=1)
    i, v = decode_coo(encode_coo(idx, torch.ones(idx.numel()), n, 1), n=n, value_dtype=torch.float32, receiver=0,
                      sender=1)
    assert torch.equal(i.long(), idx)


def _stream(idx=None, vals=(1.0, 2.0), n=100, offset=7, sender=3, dtype=torch.float32):
    v = torch.tensor(vals, dtype=dtype)
    i = None if idx is None else torch.tensor(idx, dtype=torch.int32 if n < 2**31 else torch.int64)
    return encode_stream(StreamRange(n, offset, v, i), sender)


STREAM_CASES = [
    ("offset", _stream([3, 50]), {"offset": 8}, r"a stream: offset differs: rank 3 sent 7, rank 0 expected 8"),
    ("offset-negative", _stream([3, 50], offset=-5), {}, r"offset differs: rank 3 sent -5, rank 0 expected 7"),
    ("sender", _stream([3, 50]), {"sender": 2}, r"sender differs: rank 2 sent 3, rank 0 expected 2"),
    ("value_dtype", _stream([3, 50]), {"value_dtype": torch.float64},
     r"value_dtype differs: rank 3 sent torch.float32, rank 0 expected torch.float64"),
    ("n", _stream([3, 50]), {"n": 99}, r"n differs: rank 3 sent 100, rank 0 expected 99"),
    ("kind", _set(_stream([3, 50]), 6, b"\x03"), {}, r"kind SIGNATURE is neither COO \(a sparse range\) nor DENSE"),
    ("index_dtype-dense", _set(_stream(None, [1.0] * 100), 8, b"\x05"), {},
     r"index_dtype differs: rank 3 sent torch.int32, rank 0 expected None"),
    ("index_dtype-sparse", _set(_stream([3, 50]), 8, b"\x06"), {},
     r"index_dtype differs: rank 3 sent torch.int64, rank 0 expected torch.int32"),
    ("count-dense", _set(_stream(None, [1.0] * 100), 24, struct.pack("<Q", 99)), {},
     r"count differs: rank 3 sent 99, rank 0 expected 100"),
    ("delta", _stream(list(range(51)), [1.0] * 51), {},
     r"51 sparse items, past delta = 50 \(the dense form would be smaller\)"),
    ("size", _stream([3, 50])[:-8], {}, r"a stream of 48 bytes; its header announces 2 entries, i.e. 56 bytes"),
    ("index_order-middle", _stream([3, 9, 8, 50], [1.0] * 4), {},
     r"index \[2\] = 8 follows index \[1\] = 9"),
    ("index_range", _stream([3, 100]), {}, r"index \[1\] = 100 is outside \[0, 100\)"),
    ("padding-index", _set(_stream([3, 50, 60], [1.0] * 3), 40 + 12, b"\x07"), {}, r"padding byte 52 is 0x07"),
    ("padding-values", _set(_stream(None, [1.0] * 99, n=99), 40 + 396, b"\xff"), {"n": 99},
     r"padding byte 436 is 0xff"),
]


@pytest.mark.parametrize("msg,kwargs,pattern", [c[1:] for c in STREAM_CASES], ids=[c[0] for c in STREAM_CASES])
def test_decode_stream_rejects(msg, kwargs, pattern):
    args = dict(n=100, offset=7, value_dtype=torch.float32, receiver=0, sender=3)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        decode_stream(msg, **args)


def test_decode_stream_views():
    got = decode_stream(_stream([3, 50]), n=100, offset=7, value_dtype=torch.float32, receiver=0, sender=3)
    assert got.indices.tolist() == [3, 50] and got.values.tolist() == [1.0, 2.0] and not got.is_dense
    got = decode_stream(_stream(None, [1.0] * 100), n=100, offset=7, value_dtype=torch.float32, receiver=0,
                        sender=3)
    assert got.is_dense and got.values.numel() == 100
    got = decode_stream(_stream([], []), n=100, offset=7, value_dtype=torch.float32, receiver=0, sender=3)
    assert got.indices.numel() == 0


def _qsgd(n=9, bits=4, bucket=6, offset=7, sender=1):
    packed = torch.full(((n * bits + 7) // 8,), 0x77 if bits == 4 else 7, dtype=torch.uint8)
    if bits == 4 and n % 2:
        packed[-1] = 7
    scales = torch.ones(-(-n // bucket))
    return encode_qsgd(packed, scales, n, offset, bits, bucket, sender)


QSGD_CASES = [
    ("offset", _qsgd(offset=8), {}, r"a QSGD range: offset differs: rank 1 sent 8, rank 0 expected 7"),
    ("bits", _qsgd(bits=8), {}, r"bits differs: rank 1 sent 8, rank 0 expected 4"),
    ("bits-invalid", _set(_qsgd(), 44, struct.pack("<i", 5)), {}, r"bits differs: rank 1 sent 5, rank 0 expected 4"),
    ("bucket", _qsgd(bucket=4), {}, r"bucket_size differs: rank 1 sent 4, rank 0 expected 6"),
    ("bucket-odd-for-4-bits", _set(_qsgd(), 40, struct.pack("<i", 5)), {"bucket_size": 5},
     r"bucket_size is invalid: got 5 at byte 40"),
    ("count", _set(_qsgd(), 24, struct.pack("<Q", 4)), {}, r"count differs: rank 1 sent 4, rank 0 expected 5"),
    ("value_dtype", _set(_qsgd(), 7, b"\x01"), {}, r"value_dtype differs: rank 1 sent torch.float32, "
                                                   r"rank 0 expected torch.uint8"),
    ("kind", _set(_qsgd(), 6, b"\x01"), {}, r"kind differs: rank 1 sent COO, rank 0 expected DENSE"),
    ("size", _qsgd()[:-1], {}, r"QSGD range of 63 bytes; its header announces 5 entries, i.e. 64 bytes"),
    ("padding-packed", _set(_qsgd(), 56 + 6, b"\x01"), {}, r"padding byte 62 is 0x01"),
]


@pytest.mark.parametrize("msg,kwargs,pattern", [c[1:] for c in QSGD_CASES], ids=[c[0] for c in QSGD_CASES])
def test_decode_qsgd_rejects(msg, kwargs, pattern):
    args = dict(n=9, offset=7, bits=4, bucket_size=6, receiver=0, sender=1)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        decode_qsgd(msg, **args)


def test_decode_qsgd_views():
    msg = _qsgd()
    assert msg.numel() == qsgd_nbytes(9, 4, 6)
    packed, scales = decode_qsgd(msg, n=9, offset=7, bits=4, bucket_size=6, receiver=0, sender=1)
    assert packed.numel() == 5 and scales.tolist() == [1.0, 1.0]


def _header(**kw):
    args = dict(kind=Kind.DENSE, sender=4, n=50, count=50, value_dtype=torch.float64, index_dtype=None)
    args.update(kw)
    return torch.from_numpy(pack_header(**args).copy())


HEADER_CASES = [
    ("magic", _set(_header(), 3, b"\x00"), {}, r"rank 1 received from rank 4 a message without the sparsecomm magic"),
    ("version", _set(_header(), 4, b"\x07"), {}, r"format version 7, this rank speaks 1"),
    ("kind", _header(kind=Kind.SIGNATURE), {}, r"kind differs: rank 4 sent SIGNATURE, rank 1 expected DENSE"),
    ("value_dtype", _header(value_dtype=torch.float16), {},
     r"value_dtype differs: rank 4 sent torch.float16, rank 1 expected torch.float64"),
    ("index_dtype", _header(index_dtype=torch.int32), {},
     r"index_dtype differs: rank 4 sent torch.int32, rank 1 expected None"),
    ("reserved", _set(_header(), 11, b"\x80"), {}, r"reserved header byte 11 is 128"),
    ("sender", _header(sender=5), {}, r"sender differs: rank 4 sent 5, rank 1 expected 4"),
    ("n", _header(n=51), {}, r"n differs: rank 4 sent 51, rank 1 expected 50"),
    ("count", _header(count=49), {}, r"count differs: rank 4 sent 49, rank 1 expected 50"),
    ("short", _header()[:31], {}, r"of 31 bytes, shorter than its 32-byte fixed part"),
]


@pytest.mark.parametrize("msg,kwargs,pattern", [c[1:] for c in HEADER_CASES], ids=[c[0] for c in HEADER_CASES])
def test_check_header_rejects(msg, kwargs, pattern):
    args = dict(receiver=1, sender=4, kind=Kind.DENSE, n=50, value_dtype=torch.float64, count=50)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        check_header(msg, **args)


def test_check_header_fields():
    fields = check_header(_header(), receiver=1, sender=4, kind=Kind.DENSE, n=50, value_dtype=torch.float64)
    assert fields["count"] == 50 and fields["n"] == 50 and fields["kind"] == int(Kind.DENSE)
    assert fields["value_dtype"] == 2 and fields["index_dtype"] == 0 and fields["sender"] == 4


def test_ops_argument_errors():
    op = torch.ops.sparsecomm.wire_check_coo
    good = _coo(GOOD)
    with pytest.raises(TypeError, match="payload must be uint8"):
        op(good.view(torch.int32), [-1] * 9)
    with pytest.raises(ValueError, match="expect must hold 9 ints"):
        op(good, [-1] * 8)
    with pytest.raises(ValueError, match="must be the first 48 bytes"):
        op(good, [-1] * 9, 60)
    with pytest.raises(ValueError, match="rejected its arguments"):
        op(good, [-1, -1, -1, -1, -5, -1, -1, -1, -1])
    # layout only, from the prefix: the size is checked, the indices are not
    assert op(good[:48].clone(), [-1] * 9, 60)[0] == 0
    assert op(good[:48].clone(), [-1] * 9, 61)[0] == 10  # SC_WF_SIZE
    assert op(_coo([1, 5, 5])[:48].clone(), [-1] * 9, 60)[0] == 0
    assert op(_coo([1, 5, 5]), [-1] * 9)[0] == 11  # SC_WF_INDEX_ORDER


def test_fake_kernels_registered():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake = mode.from_tensor(_coo(GOOD))
        out = torch.ops.sparsecomm.wire_check_coo(fake, [-1] * 9)
    assert len(out) == 17


def _opcheck_samples():
    good_coo = _coo(GOOD)
    return [
        ("wire_check_header", (good_coo, [-1] * 9)),
        ("wire_check_coo", (good_coo, [1, 1, -1, 3, 10, 3, -1, -1, -1])),
        ("wire_check_coo", (_coo([1, 5, 5]), [-1] * 9)),  # malformed: a result, not an exception
        ("wire_check_coo", (good_coo[:48].clone(), [-1] * 9, good_coo.numel())),
        ("wire_check_stream", (_stream([3, 50]), [-1] * 9)),
        ("wire_check_qsgd", (_qsgd(), [-1] * 9)),
    ]


@pytest.mark.parametrize("name,args", _opcheck_samples(),
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(_opcheck_samples())])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.sparsecomm, name).default, args)


_ALL = ([("coo",) + c for c in COO_CASES] + [("stream",) + c for c in STREAM_CASES]
        + [("qsgd",) + c for c in QSGD_CASES])


@pytest.mark.parametrize("form,name,msg", [c[:3] for c in _ALL], ids=[f"{c[0]}-{c[1]}" for c in _ALL])
def test_device_path_agrees_with_the_full_check(form, name, msg):
    """The path for payloads on a device (prefix on the host, indices and padding with torch
    ops), run here on CPU tensors: it accepts exactly what the full C check accepts."""
    from sparsecomm.ops import _wire
    op = _wire._op(form)
    full = op(msg, [-1] * 9)
    layout = op(msg[:48].clone(), [-1] * 9, msg.numel())
    if layout[0]:
        assert full[0] == layout[0]
    else:
        assert _wire._device_content_ok(msg, layout) == (full[0] == 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", COO_CASES, ids=[c[0] for c in COO_CASES])
def test_decode_coo_on_device(case):
    _, msg, kwargs, pattern = case
    args = dict(n=10, value_dtype=torch.float32, receiver=0, sender=3)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        decode_coo(msg.cuda(), **args)
    i, v = decode_coo(_coo(GOOD).cuda(), n=10, value_dtype=torch.float32, receiver=0, sender=3)
    assert i.is_cuda and i.tolist() == GOOD


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", STREAM_CASES + [("qsgd",) + c[1:] for c in QSGD_CASES],
                         ids=[c[0] for c in STREAM_CASES] + ["qsgd-" + c[0] for c in QSGD_CASES])
def test_decode_stream_and_qsgd_on_device(case):
    name, msg, kwargs, pattern = case
    if name == "qsgd":
        args = dict(n=9, offset=7, bits=4, bucket_size=6, receiver=0, sender=1)
        args.update(kwargs)
        with pytest.raises(WireFormatError, match=pattern):
            decode_qsgd(msg.cuda(), **args)
        return
    args = dict(n=100, offset=7, value_dtype=torch.float32, receiver=0, sender=3)
    args.update(kwargs)
    with pytest.raises(WireFormatError, match=pattern):
        decode_stream(msg.cuda(), **args)


def _corpus_module():
    spec = importlib.util.spec_from_file_location("make_fuzz_corpus", os.path.join(ROOT, "scripts",
                                                                                 "make_fuzz_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fuzz_corpus_matches_the_encoders():
    """scripts/make_fuzz_corpus.py packs messages with struct; they must be the bytes the
    Python encoders write, or the seeds would not start from valid messages."""
    c = _corpus_module()
    b = lambda t: bytes(t.tolist())  # noqa: E731
    assert c.coo([1, 5, 9], [1.0, -2.0, 3.5], 10) == b(_coo(GOOD, [1.0, -2.0, 3.5], sender=1))
    assert c.coo([2, 7], [1.0, 2.0], 31, c.F16) == b(_coo([2, 7], [1.0, 2.0], n=31, sender=1, dtype=torch.float16))
    assert c.coo([2, 7], [1.0, 2.0], 31, c.BF16) == b(_coo([2, 7], [1.0, 2.0], n=31, sender=1,
                                                           dtype=torch.bfloat16))
    assert c.stream_sparse([3, 50], [1.0, 2.0], 100, 7) == b(_stream([3, 50], sender=1))
    assert c.stream_dense([1.0, 2.0, 3.0], 7, c.F64) == b(_stream(None, [1.0, 2.0, 3.0], n=3, sender=1,
                                                                  dtype=torch.float64))
    levels = [i % 15 for i in range(9)]
    packed = bytes((levels[i] | ((levels[i + 1] if i + 1 < 9 else 0) << 4)) for i in range(0, 9, 2))
    ref = encode_qsgd(torch.tensor(list(packed), dtype=torch.uint8), torch.tensor([1.0, 2.0]), 9, 3, 4, 6, 1)
    assert c.qsgd(9, 4, 6, offset=3, levels=levels) == b(ref)
