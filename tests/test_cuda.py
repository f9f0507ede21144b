"""The GPU path, run by ``scripts/gpu_check.sh`` on a machine with CUDA (skipped elsewhere).

* Every op on CUDA tensors against the CPU kernel on the same inputs: the same bits, or the
  same exception type (sizes up to 10^8, every dtype, ties, signed zeros, Inf, NaN, bad
  indices, malformed QSGD and ZEN bitmaps; for the ZEN ops with the CUDA kernels, the same
  message too, so the same failing position and value). With the CUDA kernels (``sparsecomm.ops.CUDA_KERNELS``) every
  op must match bit for bit; with the torch implementations on CUDA, sketch builds and
  scatters with repeated indices sum in ``index_add_``'s unspecified order, so those two
  are compared to float tolerance.
* Every registered algorithm on CUDA tensors through the simulated Comm (P up to 16 ranks
  sharing the GPU) against the same run on CPU tensors: outputs, residuals, bytes, rounds.
* Every registered algorithm through NCCL at P = 1 (TorchComm), the DDP hook on a small
  GPU model (NCCL, one rank), and the FSDP2 hook on a ``fully_shard`` GPU model (one rank: the
  hook's result, computed on FSDP's all-reduce stream, must be the sharded gradient).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

import sparsecomm as sc
from sparsecomm import algorithms, ops
from sparsecomm.comm import simulate

from _reference import make_gradients
from test_torch_fallback import SKETCH_SHAPES, TOPK_CASES, ZEN_ERRORS, ZEN_SHAPES, _bits, _coo, _vector, zen_error_call

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HUGE = 100_000_000
#: ops whose torch implementation on CUDA may differ from the C kernel in the last bits: sums in
#: index_add_'s order, and the sign of a zero median (a sort, not the C kernel's median network)
UNORDERED_IN_TORCH_IMPL = {"sketch_build_", "sketch_build_coo_", "scatter_add_repeats", "sketch_estimate"}


def _to(obj, device):
    if isinstance(obj, torch.Tensor):  # always a copy: the CPU run must not write into the CUDA run's input
        return obj.to(device, copy=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


def _outcome(fn, args):
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is compared
        return "raise", type(exc), str(exc)
    torch.cuda.synchronize()
    outs = out if isinstance(out, tuple) else (out,)
    written = [a for a in args if isinstance(a, torch.Tensor)]
    return "ok", [o.cpu() for o in outs if isinstance(o, torch.Tensor)], [w.cpu() for w in written]


def _cross(fn, args, kind: str = "", tol: float = 1e-5, same_message: bool = False):
    """fn on CPU copies and on CUDA copies of args: the same bits or the same exception (for
    the torch implementations' unordered sums: within ``tol``; ``same_message``: with the CUDA
    kernels, the exception's message too)."""
    cpu = _outcome(fn, _to(args, "cpu"))
    gpu = _outcome(fn, _to(args, "cuda"))
    assert cpu[0] == gpu[0], f"CPU {cpu[:2]} ({cpu[-1]}) but CUDA {gpu[:2]} ({gpu[-1]})"
    if cpu[0] == "raise":
        assert cpu[1] is gpu[1], f"CPU raised {cpu[1].__name__} ({cpu[2]}), CUDA {gpu[1].__name__} ({gpu[2]})"
        if same_message and ops.CUDA_KERNELS:
            assert cpu[2] == gpu[2], f"CPU said {cpu[2]!r}, CUDA {gpu[2]!r}"
        return
    exact = ops.CUDA_KERNELS or kind not in UNORDERED_IN_TORCH_IMPL
    for a, b in zip(cpu[1] + cpu[2], gpu[1] + gpu[2]):
        assert a.dtype == b.dtype and a.shape == b.shape
        if exact:
            assert torch.equal(_bits(a), _bits(b)), f"differs at {(_bits(a) != _bits(b)).nonzero()[:5].tolist()}"
        else:
            assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=tol), (a.double() - b.double()).abs().max()


def test_the_kernels_in_use_are_reported():
    print(f"sparsecomm.ops.CUDA_KERNELS = {ops.CUDA_KERNELS}")
    x = torch.randn(100, device="cuda")
    v, i = ops.topk(x, 5)
    assert v.device.type == "cuda" and i.device.type == "cuda"


# ------------------------------------------------------------------ ops, CUDA against CPU

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,k,pattern", TOPK_CASES)
def test_topk(n, k, pattern, dtype):
    x = _vector(pattern, n, dtype, seed=n + k)
    _cross(ops.topk, (x, k))
    _cross(ops.topk_radix, (x, k))


@pytest.mark.parametrize("k", [1, 1000, 100_000, 10_000_000])
@pytest.mark.parametrize("pattern", ["random", "ties"])
def test_topk_huge(k, pattern):
    g = torch.Generator(device="cuda").manual_seed(k)
    if pattern == "random":
        x = torch.randn(HUGE, device="cuda", generator=g)
    else:  # 5 magnitudes for 10^8 entries: the threshold ties millions of times
        x = torch.randint(-2, 3, (HUGE,), device="cuda", generator=g).float()
    _cross(ops.topk, (x, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("blocks,k", [(1, 5), (3, 0), (3, 17), (7, 400), (1000, 1), (1500, 2), (64, 3000)])
@pytest.mark.parametrize("pattern", ["random", "ties", "inf", "nan"])
def test_block_topk(blocks, k, pattern, dtype):
    x = _vector(pattern, 1000 if blocks < 64 else 300_001, dtype, seed=blocks)
    _cross(ops.block_topk, (x, blocks, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("parts", [1, 2, 5, 16])
@pytest.mark.parametrize("count", [0, 40, 1_000_000])
def test_merge_add_many(parts, count, itype, dtype):
    vecs = [_coo(4 * count + 10, count if p % 2 == 0 else count // 2, dtype, itype, seed=p, zeros=True)
            for p in range(parts)]
    _cross(ops.merge_add_many, ([i for i, _ in vecs], [v for _, v in vecs], 4 * count + 10))
    (ia, va), (ib, vb) = vecs[0], vecs[-1]
    _cross(ops.merge_add, (ia, va, ib, vb))


@pytest.mark.parametrize("kind", ["order", "negative", "range"])
def test_merge_rejects(kind):
    good = torch.arange(1, 2000, 2, dtype=torch.int64)
    bad = torch.arange(0, 2000, 2, dtype=torch.int64)
    bad[{"order": 500, "negative": 0, "range": 999}[kind]] = {"order": bad[499].item(), "negative": -4,
                                                             "range": 5000}[kind]
    v = torch.ones(1000)
    _cross(ops.merge_add, (good, v, bad, v, 4000))
    _cross(ops.merge_add_many, ([good, good + 1, bad], [v, v, v], 4000))
    _cross(ops.stream_concat, (bad, v, torch.tensor([9000]), torch.ones(1)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("itype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("order", ["ascending", "repeats", "shuffled", "range"])
def test_scatter_add_and_gather(order, itype, dtype):
    g = torch.Generator().manual_seed(3)
    n = 1_000_000
    if order == "ascending":
        idx = torch.randperm(n, generator=g)[:300_000].sort().values
    elif order == "repeats":
        idx = torch.randint(0, 7, (200_000,), generator=g)
    elif order == "shuffled":
        idx = torch.randperm(n, generator=g)[:300_000]
    else:
        idx = torch.tensor([1, 5, n])
    idx = idx.to(itype)
    val = torch.randn(idx.numel(), generator=g, dtype=torch.float64).to(dtype)
    dense = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    kind, tol = "", 1e-5
    if order == "repeats":  # ~28,600 terms per target, summed in another order by index_add_ on CUDA
        kind = "scatter_add_repeats"
        terms = torch.bincount(idx.to(torch.int64), minlength=7).max().item() + 1
        # standard normal terms: partial sums grow as sqrt(i), so a sum's rounding error is about
        # eps * terms / 2 in any order; 4x that, for two orders and margin (one dropped or doubled
        # term, ~0.8, still fails in float32 and float64)
        tol = 4 * torch.finfo(dtype).eps * terms
    _cross(ops.scatter_add_, (dense.clone(), idx, val), kind, tol)
    _cross(ops.gather, (dense, idx))
    for zero_rest in (False, True):  # repeats: the last value in input order on both
        _cross(ops.scatter_set_, (dense.clone(), idx, val, zero_rest))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_flags(dtype):
    x = torch.randn(3_000_001, generator=torch.Generator().manual_seed(4)).to(dtype)
    cases = {"finite": [], "nan": [float("nan")], "+inf": [float("inf")], "-inf": [float("-inf")],
             "all": [float("-inf"), float("nan"), float("inf")]}
    for name, plant in cases.items():
        y = x.clone()
        for j, value in enumerate(plant):
            y[(j + 1) * y.numel() // 4] = value
        assert ops.nonfinite_flags(y.cuda()) == ops.nonfinite_flags(y), name


@pytest.mark.parametrize("n", [0, 1, 1000, 10_000_001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_stream_add_dd_and_concat(n, dtype):
    a, b = _vector("random", n, dtype, seed=1), _vector("inf", n, dtype, seed=2) if n > 5 else torch.zeros(n, dtype=dtype)
    _cross(ops.stream_add_dd_, (a.clone(), b))
    ia, va = _coo(2 * n + 10, n // 4, dtype, seed=3)
    ib, vb = _coo(2 * n + 10, n // 4, dtype, seed=4)
    _cross(ops.stream_concat, (ia[ia < n], va[ia < n], ib[ib >= n], vb[ib >= n]))
    _cross(ops.stream_concat, (ia, va, ib, vb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bits,bucket", [(8, 1), (8, 128), (8, 1000), (4, 2), (4, 64), (4, 512)])
@pytest.mark.parametrize("n", [0, 1, 999, 300_001, 30_000_001])
def test_qsgd(n, bits, bucket, dtype):
    x = _vector("random", n, dtype, seed=n)
    if n > 2 * bucket + 2:
        x[:bucket] = 0.0
        x[bucket + 1] = -0.0
    _cross(ops.qsgd_quantize, (x, bits, bucket, 12345 + n))
    packed, scales = ops.qsgd_quantize(x, bits, bucket, 12345 + n)
    _cross(ops.qsgd_dequantize, (packed, scales, n, bits, bucket, dtype))


@pytest.mark.parametrize("case", ["inf", "nan", "beyond-float32", "level", "nibble", "bad-scale"])
def test_qsgd_errors(case):
    x = torch.randn(101, dtype=torch.float64)
    if case in ("inf", "nan", "beyond-float32"):
        x[50] = {"inf": float("inf"), "nan": float("nan"), "beyond-float32": 1e300}[case]
        _cross(ops.qsgd_quantize, (x, 8, 16, 1))
        return
    packed, scales = ops.qsgd_quantize(x.float(), 4, 16, 1)
    packed, scales = packed.clone(), scales.clone()
    if case == "level":
        packed[3] = 0xFF
    elif case == "nibble":
        packed[-1] |= 0xF0
    else:
        scales[2] = float("nan")
    _cross(ops.qsgd_dequantize, (packed, scales, 101, 4, 16, torch.float32))


@pytest.mark.parametrize("tdtype,xdtype", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                           (torch.float32, torch.float64)], ids=str)
@pytest.mark.parametrize("rows,cols", SKETCH_SHAPES + [(7, 150_000)])
@pytest.mark.parametrize("n", [5003, 15_000_001])
def test_sketch(rows, cols, tdtype, xdtype, n):
    if n > 10_000 and (rows, cols) != (7, 150_000):
        pytest.skip("the large input runs on the gs-SGD-sized table only")
    x = _vector("random", n, xdtype, seed=rows * cols)
    x[::7] = 0.0
    x[1::11] = -0.0
    seed = -(2**62) + rows
    start = torch.zeros(rows, cols, dtype=tdtype)
    _cross(ops.sketch_build_, (start.clone(), x, seed), "sketch_build_")
    idx, val = _coo(n, min(n, 70_000), xdtype, seed=cols)
    rep = torch.cat([idx, idx[:50]])
    _cross(ops.sketch_build_coo_, (start.clone(), rep, torch.cat([val, val[:50]]), n, seed), "sketch_build_coo_")
    table = ops.sketch_build_(torch.zeros(rows, cols, dtype=tdtype), x, seed)
    _cross(ops.sketch_estimate, (table, n, seed), "sketch_estimate")
    _cross(ops.sketch_estimate_at, (table, rep, seed), "sketch_estimate")
    _cross(ops.sketch_estimate_at, (table, torch.tensor([1, -3]), seed))
    _cross(ops.sketch_build_coo_, (start.clone(), torch.tensor([1, n]), torch.ones(2, dtype=xdtype), n, seed))


# ------------------------------------------------------------------ ZEN's hash partition and class bitmaps

#: beside the CPU cases: many owners (most classes empty), blocks of 2^20 with a short last block,
#: block 1 and the default 64 at 10^7 indices and more
ZEN_GPU_SHAPES = ZEN_SHAPES + [(1_000_003, 100_003, 1, -5), (3_000_017, 7, 2**20, 1), (10_000_019, 5, 1, -3),
                               (30_000_001, 8, 64, 7)]


def _zen_indices(n, parts):
    """Ascending distinct indices, 1 % of [0, n) (at least 2000), and the generator that drew them."""
    g = torch.Generator().manual_seed(n + parts)
    m = min(n, max(2000, n // 100))
    return torch.randperm(n, generator=g)[:m].sort().values, g


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,parts,block,seed", ZEN_GPU_SHAPES)
def test_zen_partition(n, parts, block, seed, dtype):
    idx, g = _zen_indices(n, parts)
    val = torch.randn(idx.numel(), generator=g, dtype=torch.float64).to(dtype)
    val[::3] = -0.0
    _cross(ops.zen_partition, (idx, val, n, parts, seed, block), same_message=True)


@pytest.mark.parametrize("n,parts,block,seed", ZEN_GPU_SHAPES)
def test_zen_bitmaps(n, parts, block, seed):
    idx, g = _zen_indices(n, parts)
    got, _, counts = ops.zen_partition(idx, torch.zeros(idx.numel()), n, parts, seed, block)
    cuts = [0] + torch.cumsum(counts, 0).tolist()
    starts, blocks = ops.zen_class_blocks(n, parts, seed, block)
    block_cuts = [0] + torch.cumsum(blocks, 0).tolist()
    for owner in sorted({0, parts // 2, parts - 1}):
        args = (n, parts, seed, block, owner)
        mine = got[cuts[owner]:cuts[owner + 1]]
        _cross(ops.zen_bitmap_encode, (mine, *args), same_message=True)
        bitmap = ops.zen_bitmap_encode(mine, *args)
        _cross(ops.zen_bitmap_decode, (bitmap, *args), same_message=True)
        # random bytes over the whole class (padding bits cleared): up to 8 indices a byte
        first = starts[block_cuts[owner]:block_cuts[owner + 1]]
        size = first.numel() * block - (max(0, int(first[-1]) + block - n) if first.numel() else 0)
        assert bitmap.numel() == (size + 7) // 8
        dense = torch.randint(0, 256, (bitmap.numel(),), generator=g, dtype=torch.uint8)
        if size % 8:
            dense[-1] &= (1 << size % 8) - 1
        _cross(ops.zen_bitmap_decode, (dense, *args), same_message=True)
        _cross(ops.zen_bitmap_encode, (ops.zen_bitmap_decode(dense, *args), *args), same_message=True)


#: beside the CPU cases: a negative index, and the first of several faults far into large inputs
#: (the CPU kernel's order: index order and range before class membership)
ZEN_GPU_ERRORS = ["negative", "late_order", "late_other_class", "range_after_other_class", "encode_order",
                  "short_bitmap", "late_padding_bit"]


def _zen_gpu_error_call(case: str):
    n, parts, block, seed = 2_000_003, 5, 4, 77
    if case == "negative":
        return ops.zen_partition, (torch.tensor([-1, 5, 9]), torch.ones(3), n, parts, seed, block)
    if case == "late_order":
        idx = torch.arange(0, n - 3, 2)
        idx[700_000] = idx[699_999]
        idx[900_001] = 0
        return ops.zen_partition, (idx, torch.ones(idx.numel()), n, parts, seed, block)
    got, _, counts = ops.zen_partition(torch.arange(n), torch.ones(n), n, parts, seed, block)
    cuts = [0] + torch.cumsum(counts, 0).tolist()
    owner = next(c for c in range(parts) if int(counts[c]) % 8)  # a class with padding bits
    mine, theirs = got[cuts[owner]:cuts[owner + 1]], got[cuts[(owner + 1) % parts]:cuts[(owner + 1) % parts + 1]]
    args = (n, parts, seed, block, owner)
    late = theirs[theirs > mine[mine.numel() // 2]][[0, 1000]]  # two indices of another class, late in mine
    if case == "late_other_class":
        return ops.zen_bitmap_encode, (torch.cat([mine, late]).sort().values, *args)
    if case == "range_after_other_class":
        return ops.zen_bitmap_encode, (torch.cat([torch.cat([mine, late]).sort().values, torch.tensor([n + 5])]), *args)
    if case == "encode_order":
        bad = mine.clone()
        bad[-10] = bad[-11]
        return ops.zen_bitmap_encode, (bad, *args)
    full = ops.zen_bitmap_encode(mine, *args)
    if case == "short_bitmap":
        return ops.zen_bitmap_decode, (full[:-1].clone(), *args)
    bad = full.clone()
    bad[-1] |= 0x80
    return ops.zen_bitmap_decode, (bad, *args)


@pytest.mark.parametrize("case", ZEN_ERRORS + ZEN_GPU_ERRORS)
def test_zen_errors(case):
    fn, args = (_zen_gpu_error_call if case in ZEN_GPU_ERRORS else zen_error_call)(case)
    _cross(fn, args, same_message=True)


def test_zen_ops_have_cuda_kernels():
    if not ops.CUDA_KERNELS:
        pytest.skip("built without the CUDA kernels: CUDA tensors run the torch implementations")
    from sparsecomm.ops import _torch_impl
    assert not {"zen_partition", "zen_bitmap_encode", "zen_bitmap_decode"} & set(_torch_impl.cuda_gaps())


# ------------------------------------------------------------------ every algorithm on CUDA tensors

EXTRA_OPTIONS = {"topkdsa": [{"quantize_bits": 4, "bucket_size": 64}, {"quantize_bits": 8}],
                 "gssgd": [{"heavymix": "random"}], "spardl": [{"teams": 2}]}
#: auto's choice follows its timings, which differ between a CPU and a CUDA run: pinned links and
#: no trial calls make it a function of (P, N, k), the same on both devices
BASE_OPTIONS = {"auto": {"alpha": 50e-6, "beta": 1e-9, "tune": 0}}
MATRIX = [(name, options) for name in algorithms.names()
          for options in [BASE_OPTIONS.get(name, {})] + EXTRA_OPTIONS.get(name, [])]


def _history(name, options, size, n, density, dtype, device, steps=2):
    grads = [make_gradients("random", n, size, step, dtype, seed=11) for step in range(steps)]

    def rank(comm):
        reducer = sc.SparseAllreduce(name, density, comm=comm, **options)
        runs = []
        for step in range(steps):
            out = reducer(grads[step][comm.rank].to(device))
            s = reducer.last_stats
            assert out.device.type == torch.device(device).type and reducer.residual.device == out.device
            # copies: on CPU, .cpu() would keep the live residual that the next step updates
            runs.append((out.to("cpu", copy=True), reducer.residual.to("cpu", copy=True),
                         (s["bytes_sent"], s["rounds"], s["nnz_out"])))
        return runs

    return simulate(size, rank, device=device).results


@pytest.mark.parametrize("name,options", MATRIX, ids=[f"{n}-{o}" if o else n for n, o in MATRIX])
@pytest.mark.parametrize("size,n,dtype", [(1, 100_003, torch.float32), (4, 1_000_003, torch.float32),
                                          (16, 200_003, torch.float64), (6, 100_003, torch.bfloat16)],
                         ids=["P1", "P4", "P16-f64", "P6-bf16"])
def test_algorithm_on_cuda_matches_cpu(name, options, size, n, dtype):
    if name == "spardl" and options.get("teams") and size % options["teams"]:
        pytest.skip("teams must divide P")
    cpu = _history(name, options, size, n, 0.01, dtype, "cpu")
    gpu = _history(name, options, size, n, 0.01, dtype, "cuda")
    exact = ops.CUDA_KERNELS or name != "gssgd"  # the torch sketch build sums in atomic order
    for r in range(size):
        for step, (c, g) in enumerate(zip(cpu[r], gpu[r])):
            assert c[2] == g[2], (r, step, c[2], g[2])
            for a, b in zip(c[:2], g[:2]):
                if exact:
                    assert torch.equal(_bits(a), _bits(b)), (r, step)
                else:
                    assert torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-4)


def _two_level_history(name, nodes, per_node, n, dtype, device, steps=2):
    grads = [make_gradients("random", n, nodes * per_node, step, dtype, seed=13) for step in range(steps)]

    def rank(comm):
        reducer = sc.SparseAllreduce(name, 0.01, comm=comm, hierarchy="node", nodes=sc.Topology(nodes, per_node))
        runs = []
        for step in range(steps):
            out = reducer(grads[step][comm.rank].to(device))
            assert out.device.type == torch.device(device).type
            runs.append((out.to("cpu", copy=True), reducer.residual.to("cpu", copy=True),
                         reducer.last_stats["inter_bytes_sent"]))
        return runs

    return simulate(nodes * per_node, rank, device=device).results


@pytest.mark.parametrize("name", ["dense", "topka", "spardl", "oktopk", "gtopk"])
@pytest.mark.parametrize("nodes,per_node,dtype", [(2, 2, torch.float32), (3, 2, torch.bfloat16)], ids=["2x2", "3x2-bf16"])
def test_two_level_on_cuda_matches_cpu(name, nodes, per_node, dtype):
    """hierarchy="node" on CUDA tensors (the node's reduce-scatter and all-gather move device
    buffers; the shard's algorithm runs the CUDA ops): bit-identical to the CPU run."""
    cpu = _two_level_history(name, nodes, per_node, 300_007, dtype, "cpu")
    gpu = _two_level_history(name, nodes, per_node, 300_007, dtype, "cuda")
    for r, (c_runs, g_runs) in enumerate(zip(cpu, gpu)):
        for step, (c, g) in enumerate(zip(c_runs, g_runs)):
            assert c[2] == g[2], (r, step)
            assert torch.equal(_bits(c[0]), _bits(g[0])) and torch.equal(_bits(c[1]), _bits(g[1])), (r, step)


# ------------------------------------------------------------------ NCCL at P = 1, the hook

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nccl_world():
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_every_algorithm_through_nccl(nccl_world):
    from sparsecomm.comm import TorchComm
    comm = TorchComm()
    assert comm.device.type == "cuda"
    n = 500_003
    grads = make_gradients("random", n, 1, 0, torch.float32, seed=5)
    for name, options in MATRIX:
        if name == "spardl" and options.get("teams"):
            continue
        reducer = sc.SparseAllreduce(name, 0.01, comm=comm, **options)
        g = grads[0].cuda()
        out = reducer(g.clone())
        torch.cuda.synchronize()
        assert out.device.type == "cuda"
        # one rank: what left the residual is the output (conservation), nothing else
        assert torch.allclose((out + reducer.residual).cpu(), grads[0], rtol=1e-6, atol=1e-5), name
        cpu = simulate(1, lambda c: sc.SparseAllreduce(name, 0.01, comm=c, **options)(grads[0].clone())).results[0]
        assert torch.equal(out.cpu(), cpu) or not ops.CUDA_KERNELS and name == "gssgd", name


def test_hook_on_a_gpu_model(nccl_world):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.05)
    state = sc.DDPHookState("topka", 0.05)
    ddp.register_comm_hook(state, sc.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = torch.randn(512, 64, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        # one rank: the averaged gradient holds each bucket's top 5% (k per bucket), no more
        nnz = sum(int((p.grad != 0).sum()) for p in ddp.parameters())
        total = sum(p.numel() for p in ddp.parameters())
        assert all(p.grad.device.type == "cuda" for p in ddp.parameters())
        assert nnz <= 0.05 * total + 16, (nnz, total)
    assert losses[-1] < losses[0], losses


def test_fsdp_hook_on_a_gpu_model(nccl_world):
    """The FSDP2 hook on CUDA: FSDP calls it on its all-reduce stream between the reduce-scatter
    and the gradient views. One GPU has no second node, so the inter-node group here is the
    one-rank world itself (a NodeComms built by hand): the topka result plus the new residual
    must then be exactly the reduce-scatter output plus the old residual, and the sharded
    gradient FSDP hands the optimizer must be that result (a stream race shows as a mismatch)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from sparsecomm.comm import TorchComm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    mesh = init_device_mesh("cuda", (1,))
    for sub in model:
        if isinstance(sub, torch.nn.Linear):
            fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    world = TorchComm()
    nodes = sc.NodeComms(sc.Topology(1, 1, 0, 0), world, None, world)
    state = sc.FSDPHookState("topka", 0.05, nodes=nodes, comm=world)
    sc.fsdp.register_hook(model, state)
    seen = {}
    inner = state._reduce

    def recording(label, group, output):
        before = state._reducers[label].residual
        g = output.detach().clone() + (0 if before is None else before.reshape(-1))
        inner(label, group, output)
        seen[label] = (g, output.detach().clone(), state._reducers[label].residual.reshape(-1).clone())
    state._reduce = recording
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(512, 64, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.cuda.synchronize()
        for label, (g, out, residual) in seen.items():
            assert torch.allclose(out + residual, g, rtol=0, atol=0), label
            assert int((out != 0).sum()) <= sc.k_for(0.05, out.numel()), label
        grads = torch.cat([p.grad.to_local().reshape(-1) for p in model.parameters()])
        outs = torch.cat([seen[label][1] for label in sorted(seen, key=lambda s: ("0", "2").index(s))])
        assert torch.equal(grads, outs[:grads.numel()]), "the sharded gradients are not the hook's result"
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses
