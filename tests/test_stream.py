"""Sparse streams (SparCML section 3): the C summation kernels, the dense switch at delta,
the wire format and its validation, and QSGD packing (section 5). References are plain
torch dense math written here."""

from __future__ import annotations

import pytest
import torch

import sparsecomm as sc
from sparsecomm.formats.header import WireFormatError
from sparsecomm.algorithms._sparse_stream import SparseStream
from sparsecomm.formats.stream import (decode_qsgd, decode_stream, encode_qsgd, encode_stream, stream_delta,
                                       stream_nbytes)


def rand_sparse(n, count, dtype, gen, index_dtype=torch.int64):
    idx = torch.randperm(n, generator=gen)[:count].sort().values.to(index_dtype)
    return idx, torch.randn(count, generator=gen, dtype=torch.float64).to(dtype)


def dense_of(n, idx, val, dtype=torch.float64):
    d = torch.zeros(n, dtype=dtype)
    d[idx.long()] = val.to(dtype)
    return d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_kernels_match_dense_math(dtype, index_dtype):
    gen = torch.Generator().manual_seed(1)
    n = 1000
    ia, va = rand_sparse(n, 300, dtype, gen, index_dtype)
    ib, vb = rand_sparse(n, 200, dtype, gen, index_dtype)
    io, vo = sc.ops.stream_add_ss(ia, va, ib, vb)
    assert io.dtype == index_dtype and bool((io[1:] > io[:-1]).all())
    ref = dense_of(n, ia, va, dtype) + dense_of(n, ib, vb, dtype)
    assert torch.equal(dense_of(n, io, vo, dtype), ref)
    d = dense_of(n, ia, va, dtype)
    sc.ops.stream_add_sd_(d, ib, vb)
    assert torch.equal(d, ref)
    a, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    expect = a + b
    assert torch.equal(sc.ops.stream_add_dd_(a, b), expect)
    lo = ia[ia < 500]
    hi = ib[ib >= 500]
    ci, cv = sc.ops.stream_concat(lo, va[:lo.numel()], hi, vb[vb.numel() - hi.numel():])
    assert torch.equal(ci, torch.cat([lo, hi]))
    with pytest.raises(ValueError, match="ascending"):
        sc.ops.stream_concat(hi, vb[:hi.numel()], lo, va[:lo.numel()])
    with pytest.raises(ValueError, match="ascending"):
        sc.ops.stream_add_ss(ia.flip(0), va, ib, vb)
    with pytest.raises(ValueError, match="indices < 10"):
        sc.ops.stream_add_sd_(torch.zeros(10, dtype=dtype), ib, vb)


def test_torch_fallback_half():
    gen = torch.Generator().manual_seed(2)
    ia, va = rand_sparse(100, 30, torch.bfloat16, gen)
    ib, vb = rand_sparse(100, 30, torch.bfloat16, gen)
    io, vo = sc.ops.stream_add_ss(ia, va, ib, vb)
    assert torch.equal(dense_of(100, io, vo, torch.bfloat16),
                       dense_of(100, ia, va, torch.bfloat16) + dense_of(100, ib, vb, torch.bfloat16))


def test_delta_and_dense_switch():
    # float32 with int32 indices: delta = n * 4 / 8
    assert stream_delta(1000, torch.float32) == 500
    assert stream_delta(1000, torch.float64) == 666
    gen = torch.Generator().manual_seed(3)
    n = 1000
    ia, va = rand_sparse(n, 300, torch.float32, gen)
    ib, vb = rand_sparse(n, 150, torch.float32, gen)
    a, b = SparseStream.sparse(ia, va, n), SparseStream.sparse(ib, vb, n)
    s = a.add(b)  # 450 <= 500: stays sparse
    assert not s.is_dense
    pick = torch.randperm(s.count, generator=gen)[:120].sort().values
    ic, vc = s.indices[pick].long(), torch.randn(120, generator=gen)  # union stays s: 'sparse-sized'
    assert s.count + 120 > 500 and s.count <= 500
    t = s.add(SparseStream.sparse(ic, vc, n))  # bound |H1|+|H2| > 500: dense even if the union is smaller
    assert t.is_dense
    ref = dense_of(n, ia, va, torch.float32) + dense_of(n, ib, vb, torch.float32) + dense_of(n, ic, vc, torch.float32)
    assert torch.equal(t.values, ref)
    # same sums, either representation: bit-identical
    out1 = torch.zeros(n)
    s.write_into(out1)
    assert torch.equal(out1, (dense_of(n, ia, va, torch.float32) + dense_of(n, ib, vb, torch.float32)))
    # a vector with more than delta items starts dense
    idx, val = rand_sparse(n, 600, torch.float32, gen)
    assert SparseStream.sparse(idx, val, n).is_dense
    # disjoint ranges: concatenation, dense past the joint delta
    left = SparseStream.sparse(torch.tensor([1, 5]), torch.tensor([1.0, 2.0]), 10, 0)
    right = SparseStream.sparse(torch.tensor([0, 3]), torch.tensor([3.0, 4.0]), 6, 10)
    j = left.concat(right)
    assert not j.is_dense and j.indices.tolist() == [1, 5, 10, 13] and j.n == 16
    full = torch.zeros(16)
    j.write_into(full)
    assert full.tolist() == [0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 4, 0, 0]


@pytest.mark.parametrize("dense", [False, True])
def test_wire_roundtrip_and_validation(dense):
    gen = torch.Generator().manual_seed(4)
    n = 777
    idx, val = rand_sparse(n, 50, torch.float32, gen)
    s = SparseStream.sparse(idx, val, n, offset=100)
    if dense:
        s = s.densified()
    msg = encode_stream(s, sender=3)
    assert msg.numel() == stream_nbytes(n, s.count, torch.float32, dense) and msg.numel() % 8 == 0
    got = decode_stream(msg, n=n, offset=100, value_dtype=torch.float32, receiver=0, sender=3)
    assert got.is_dense == dense and torch.equal(got.values, s.values)
    with pytest.raises(WireFormatError, match="offset"):
        decode_stream(msg, n=n, offset=0, value_dtype=torch.float32, receiver=0, sender=3)
    with pytest.raises(WireFormatError, match="sender"):
        decode_stream(msg, n=n, offset=100, value_dtype=torch.float32, receiver=0, sender=2)
    with pytest.raises(WireFormatError, match="value_dtype"):
        decode_stream(msg, n=n, offset=100, value_dtype=torch.float64, receiver=0, sender=3)
    with pytest.raises(WireFormatError):
        decode_stream(msg[:-8], n=n, offset=100, value_dtype=torch.float32, receiver=0, sender=3)


@pytest.mark.parametrize("bits", [4, 8])
def test_qsgd_unbiased_and_packed(bits):
    n, bucket = 1001, 64
    x = torch.randn(n, generator=torch.Generator().manual_seed(5), dtype=torch.float64).float()
    packed, scales = sc.ops.qsgd_quantize(x, bits, bucket, 123)
    assert packed.numel() == (n * bits + 7) // 8 and scales.numel() == -(-n // bucket)
    msg = encode_qsgd(packed, scales, n, 7, bits, bucket, sender=1)
    p2, s2 = decode_qsgd(msg, n=n, offset=7, bits=bits, bucket_size=bucket, receiver=0, sender=1)
    y = sc.ops.qsgd_dequantize(p2, s2, n, bits, bucket, torch.float32)
    s = (1 << (bits - 1)) - 1
    step = scales.repeat_interleave(bucket)[:n] / s
    assert bool(((y - x).abs() <= step * 1.0001).all())  # one level at most
    # unbiased: the mean over many seeds converges to x
    trials = 400
    mean = torch.zeros(n, dtype=torch.float64)
    for seed in range(trials):
        p, sc_ = sc.ops.qsgd_quantize(x, bits, bucket, seed)
        mean += sc.ops.qsgd_dequantize(p, sc_, n, bits, bucket, torch.float32).double()
    mean /= trials
    err = (mean - x.double()).abs()
    bound = 4 * step.double() / (2 * trials ** 0.5) + 1e-6  # 4 sigma of a Bernoulli level
    assert bool((err <= bound).all()), float((err - bound).max())
    # deterministic for a seed
    assert torch.equal(sc.ops.qsgd_quantize(x, bits, bucket, 9)[0], sc.ops.qsgd_quantize(x, bits, bucket, 9)[0])
