"""Contracts of the op layer as a whole: torch.library conventions (schemas, fake
kernels, opcheck for every op, mutating ops return nothing), torch.compile, the one
status -> exception mapping, and the safety of every kernel on adversarial inputs
(repeated indices and overlapping buffers on the serial and parallel paths, full
validation of peer data, no uninitialised bytes in outputs)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm import ops
from sparsecomm.errors import WireFormatError
from sparsecomm.ops._errors import WIRE_PREFIX, _translate

LARGE = 300_001  # above every kernel's parallel threshold (65,536 and 262,144 entries)


def _i(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)


def _f(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)


# One sample call per op: (op name, args). Each op of the sparsecomm namespace must
# appear here (test_every_op_has_an_opcheck_sample), so a new op cannot skip opcheck.
def _samples():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    table = torch.zeros(3, 64)
    packed, scales = ops.qsgd_quantize(x, 8, 128, 7)
    return [
        ("topk", (x, 10)),
        ("topk_radix", (x, 10)),
        ("block_topk", (x, 4, 5)),
        ("topk_accum_", (x.clone(), torch.randn(1000, generator=g), 3, 4, True, torch.empty(12),
                         torch.empty(12, dtype=torch.int64))),
        ("merge_add", (_i(1, 4, 9), _f(1, 2, 3), _i(4, 5), _f(10, 20), 10)),
        ("merge_add_many", ([_i(1, 4), _i(0, 4), _i(7)], [_f(1, 2), _f(3, 4), _f(5)], -1)),
        ("scatter_add_", (torch.zeros(10), _i(1, 1, 3), _f(1, 2, 3))),
        ("scatter_set_", (torch.ones(10), _i(1, 1, 3), _f(1, 2, 3), False)),
        ("scatter_set_", (torch.ones(10), _i(1, 3, 7), _f(1, 2, 3), True)),
        ("gather", (x, _i(5, 0, 999, 5))),
        ("nonfinite_flags", (torch.tensor([1.0, float("nan"), -float("inf")]),)),
        ("nonfinite_flags", (x.reshape(10, 100),)),
        ("stream_add_dd_", (torch.ones(100), torch.full((100,), 2.0))),
        ("stream_concat", (_i(1, 2), _f(1, 2), _i(5, 9), _f(3, 4))),
        ("qsgd_quantize", (x, 4, 64, 3)),
        ("qsgd_dequantize", (packed, scales, 1000, 8, 128, torch.float32)),
        ("sketch_build_", (table.clone(), x, 5)),
        ("sketch_build_coo_", (table.clone(), _i(3, 900, 3), _f(1, 2, 3), 1000, 5)),
        ("sketch_estimate", (torch.randn(3, 64, generator=g), 100, 5)),
        ("sketch_estimate_at", (torch.randn(3, 64, generator=g), _i(0, 17, 99), 5)),
        ("densestream_encode_coo", (_i(1, 2, 9, dtype=torch.int32), _f(1, 2, 3), 20, 0)),
        ("densestream_encode_dense", (_f(0, 1, 0, 2, 0, 0, 0, 3), 1)),
        ("densestream_add", (_i(1, 9), _i(2, 1), _f(1, 2, 3), _i(2), _i(3), _f(-2, 4, 5), 20, 0)),
        ("densestream_slice", (_i(1, 9), _i(2, 1), _f(1, 2, 3), 20, 2, 10, 0)),
        ("densestream_add_into_", (torch.zeros(20), _i(1, 9), _i(2, 1), _f(1, 2, 3))),
        ("densestream_to_coo", (_i(1, 9), _i(2, 1), _f(1, 0, 3), 20)),
        ("wire_check_densestream", (_densestream_message(), [1, 0, 20, 2, 0, 20])),
        ("skcompress_quantiles", (x, 16, 100)),
        ("skcompress_quantize", (x, 256, 65536)),
        ("skcompress_encode", (_i(3, 17, 900), _f(1, -2, 3), 1000, 1, 1, 256, 2, 0.2, 8, 0, 0, 65536)),
        ("skcompress_encode_decoded", (_i(3, 17, 900), _f(1, -2, 3), 1000, 1, 1, 256, 2, 0.2, 8, 0, 0, 65536)),
        ("skcompress_decode", (ops.skcompress_encode(_i(3, 17, 900), _f(1, -2, 3), 1000), 1000, 3,
                               torch.float32, 1, 1)),
        ("zen_partition", (_i(0, 3, 17, 64, 900), _f(1, -2, 3, 4, 5), 1000, 3, 7, 4)),
        ("zen_bitmap_encode", (ops.zen_partition(_i(0, 3, 17, 64, 900), _f(1, 2, 3, 4, 5), 1000, 3, 7, 4)[0][:1],
                               1000, 3, 7, 4, int(_zen_owner_of_first()))),
        ("zen_bitmap_decode", (torch.zeros(_zen_bitmap_bytes(), dtype=torch.uint8), 1000, 3, 7, 4, 0)),
    ]


def _zen_owner_of_first():
    """The owner of the first pair zen_partition puts first (the lowest owner with a pair)."""
    counts = ops.zen_partition(_i(0, 3, 17, 64, 900), _f(1, 2, 3, 4, 5), 1000, 3, 7, 4)[2]
    return int((counts > 0).nonzero()[0])


def _zen_bitmap_bytes():
    return ops.zen_bitmap_encode(_i(), 1000, 3, 7, 4, 0).numel()


def _densestream_message():
    from sparsecomm.formats.densestream import DenseBlocks, encode_densestream
    return encode_densestream(DenseBlocks(20, 0, 20, _i(1, 9), _i(2, 1), _f(1, 2, 3)), 0)


_TENSORLESS = {"release_caches"}  # takes no tensor: nothing to fake or to check


def test_every_op_has_an_opcheck_sample():
    from test_wire import _opcheck_samples as wire_samples  # the wire ops' samples live beside their tests

    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("sparsecomm::")}
    sampled = {name for name, _ in _samples()} | {name for name, _ in wire_samples()}
    assert registered - _TENSORLESS == sampled, (registered, sampled)


@pytest.mark.parametrize("name,args", _samples(), ids=[n for n, _ in _samples()])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.sparsecomm, name).default, args)


@pytest.mark.parametrize("name", ["scatter_add_", "scatter_set_", "topk_accum_", "stream_add_dd_", "sketch_build_", "sketch_build_coo_",
                                  "densestream_add_into_"])
def test_mutating_ops_return_nothing(name):
    schema = getattr(torch.ops.sparsecomm, name).default._schema
    assert schema.returns == [], str(schema)
    assert any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments), str(schema)


def _local_step(grad, residual, k):
    """The local half of a TopkA step: error feedback, exact top-k, residual update."""
    acc = grad + residual
    values, indices = ops.topk(acc, k)
    new_residual = acc.clone()
    ops.scatter_add_(new_residual, indices, -values)
    return values, indices, new_residual


def test_local_step_compiles_fullgraph():
    g = torch.Generator().manual_seed(1)
    grad, residual = torch.randn(5000, generator=g), torch.randn(5000, generator=g)
    compiled = torch.compile(_local_step, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(grad, residual, 50), _local_step(grad, residual, 50)):
        assert torch.equal(got, want)


def test_reducer_step_inside_torch_compile():
    # a compiled training step that calls a reducer: the reducer runs eagerly (a graph
    # break, see SparseAllreduce.__call__), the compute around it is compiled, and the
    # result equals the eager run bit for bit
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(4000, generator=g) for _ in range(3)]

    def step(reducer, grad):
        summed = reducer(grad * 0.5)
        return summed.sum() + summed.abs().max(), summed

    def run(compile_it):
        def fn(comm):
            reducer = sc.SparseAllreduce("topka", 0.01, comm=comm)
            s = torch.compile(step, backend="aot_eager") if compile_it else step
            out = []
            for x in grads:
                out.extend(s(reducer, x.clone()))
            return out + [reducer.residual.clone()]
        return sc.comm.simulate(1, fn).results[0]

    for got, want in zip(run(True), run(False)):
        assert torch.equal(got, want)


# ------------------------------------------------------------ status -> exception

@pytest.mark.parametrize("raised,expected", [
    (torch.OutOfMemoryError("sparsecomm.topk: out of memory"), MemoryError),
    (ValueError(WIRE_PREFIX + "sparsecomm.qsgd_dequantize: packed is malformed"), WireFormatError),
    (ValueError("sparsecomm.topk: k must be >= 0, got -1"), None),
    (RuntimeError("sparsecomm::topk() Expected a value of type 'int' for argument 'k'"), TypeError),
    (RuntimeError("some other failure"), None),
])
def test_status_mapping(raised, expected):
    mapped = _translate(raised)
    if expected is None:
        assert mapped is None
    else:
        assert type(mapped) is expected
        assert WIRE_PREFIX not in str(mapped)


def test_wrong_argument_type_is_a_type_error():
    with pytest.raises(TypeError):
        ops.topk(torch.randn(10), 1.5)


# ------------------------------------------------------------ repeated indices

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fn", [ops.scatter_add_, ops.stream_add_sd_], ids=["scatter_add_", "stream_add_sd_"])
def test_scatter_repeated_indices_loses_nothing(fn, threads):
    # 2M updates into 8 slots (the parallel scatter once lost updates here)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rng = np.random.default_rng(3)
        idx = torch.from_numpy(rng.integers(0, 8, 2_000_000))
        dense = torch.zeros(8, dtype=torch.float64)
        fn(dense, idx, torch.ones(idx.numel(), dtype=torch.float64))
        want = np.bincount(idx.numpy(), minlength=8).astype(np.float64)
        np.testing.assert_array_equal(dense.numpy(), want)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_scatter_parallel_distinct_equals_reference(dtype):
    rng = np.random.default_rng(4)
    n = 2 * LARGE
    idx = torch.from_numpy(np.sort(rng.choice(n, LARGE, replace=False)))
    val = torch.from_numpy(rng.standard_normal(LARGE)).to(dtype)
    dense = torch.from_numpy(rng.standard_normal(n)).to(dtype)
    if dtype in (torch.float16, torch.bfloat16):  # summed in float32, rounded once
        want = dense.float().index_add(0, idx, val.float()).to(dtype)
    else:
        want = dense.index_add(0, idx, val)
    ops.scatter_add_(dense, idx, val)
    assert torch.equal(dense, want)


# ------------------------------------------------------------ overlapping buffers

def test_dense_add_in_place_on_itself_and_partial_overlap():
    z = torch.arange(LARGE, dtype=torch.float32)
    ops.stream_add_dd_(z, z)  # the same buffer: a += a
    assert torch.equal(z, 2 * torch.arange(LARGE, dtype=torch.float32))
    with pytest.raises(ValueError, match="overlap"):
        ops.stream_add_dd_(z[1:], z[:-1])
    assert torch.equal(z, 2 * torch.arange(LARGE, dtype=torch.float32))  # nothing written


def test_scatter_values_overlapping_dense_are_rejected():
    dense = torch.arange(10, dtype=torch.float32)
    with pytest.raises(ValueError, match="overlap"):
        ops.scatter_add_(dense, _i(0, 1), dense[2:4])
    assert torch.equal(dense, torch.arange(10, dtype=torch.float32))


# ------------------------------------------------------------ peer data validated in full

@pytest.mark.parametrize("position", [1, 70_000, 150_000, LARGE - 1])
@pytest.mark.parametrize("fault", ["order", "range"])
def test_merge_finds_a_fault_anywhere_in_a_large_input(position, fault):
    idx = torch.arange(LARGE, dtype=torch.int64) * 2
    if fault == "order":
        idx[position] = idx[position - 1]  # a duplicate
        match = rf"indices\[1\]\[{position}\].*strictly ascending|strictly ascending.*\[{position}\]"
    else:
        idx[position:] += 10 * LARGE  # leaves [0, n) from `position` on
        match = rf"\[{position}\] = "
    vals = torch.ones(LARGE)
    with pytest.raises(ValueError, match=match):
        ops.merge_add_many([torch.arange(3), idx], [torch.ones(3), vals], n=3 * LARGE)


def test_sketch_coo_index_out_of_range_writes_nothing():
    table = torch.zeros(3, 64)
    with pytest.raises(ValueError, match="< 100"):
        ops.sketch_build_coo_(table, _i(5, 100), _f(1, 2), 100, 1)
    assert not table.any()


def test_block_topk_more_blocks_than_elements():
    x = torch.randn(1000)
    v, i = ops.block_topk(x, 2**61, 1)
    assert torch.equal(i, torch.arange(1000)) and torch.equal(v, x)
    v, i = ops.block_topk(x, 2**61, 0)
    assert v.numel() == 0 and i.numel() == 0


# ------------------------------------------------------------ QSGD packing and decoding

@pytest.mark.parametrize("n", [1, 7, 1001, LARGE])
def test_qsgd_4bit_writes_every_byte(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    results = []
    for fill in (0x00, 0xFF):
        # leave freed memory of a known pattern for the output allocation to reuse
        junk = torch.full(((n * 4 + 7) // 8,), fill, dtype=torch.uint8)
        del junk
        results.append(ops.qsgd_quantize(x, 4, 64, 11)[0])
    assert torch.equal(results[0], results[1])
    if n % 2:
        assert int(results[0][-1]) >> 4 == 0  # the unused high nibble is zero
    levels = torch.stack([results[0] & 0xF, results[0] >> 4], 1).reshape(-1)[:n]
    assert int(levels.max()) <= 14  # 2s for s = 7


@pytest.mark.parametrize("case", ["level", "nan_scale", "negative_scale", "unused_nibble"])
def test_qsgd_dequantize_rejects_malformed(case):
    n, bits, bucket = 9, 4, 4
    packed, scales = ops.qsgd_quantize(torch.randn(n), bits, bucket, 1)
    packed, scales = packed.clone(), scales.clone()
    if case == "level":
        packed[0] = 0xFF  # 15 > 2s = 14
    elif case == "nan_scale":
        scales[1] = float("nan")
    elif case == "negative_scale":
        scales[0] = -1.0
    else:
        packed[-1] |= 0x10  # n odd: the last high nibble is unused
    with pytest.raises(WireFormatError):
        ops.qsgd_dequantize(packed, scales, n, bits, bucket, torch.float32)


# ------------------------------------------------------------ caches

def test_release_caches_frees_the_topk_buffers():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ops.release_caches()
        x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(5))
        ops.topk(x, 40_000)  # the sampled fast path keeps candidate buffers
        assert ops.release_caches() > 0
        assert ops.release_caches() == 0
        ops.topk(x, 40_000)  # still works after a release
    finally:
        torch.set_num_threads(old)
