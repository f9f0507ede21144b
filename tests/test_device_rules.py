"""Device rules of docs/architecture.md, checked without a GPU.

1. Every buffer the reducer, an algorithm, a collective, a codec or the simulated Comm
   allocates follows its input's device: each factory call (``torch.zeros``, ``empty``,
   ``arange``, ``tensor``, ...) names its device -- the input's, or ``device="cpu"`` for a
   value that is host data on purpose. Checked twice while every registered algorithm runs:
   a torch function mode lists every factory call made outside torch without ``device=``,
   and torch's default device is ``meta`` inside the ranks, so such a buffer fails at its
   first use with a real one (or leaves ``meta`` in the result). ``torch.zeros(n)`` anywhere
   on the path fails the test.
2. Nothing N- or k-sized goes to the host: ``Tensor.cpu`` and ``tolist`` are watched while
   every algorithm runs (N = 100k, k = 2000); only control data (headers, sizes, flags,
   histograms: at most ``HOST_BYTES`` = 4096 + 64 P bytes a read) may be read back, so an
   ``acc.cpu()`` round trip fails the test. ``numpy()`` is not watched: on a CUDA tensor it
   raises (tests/test_cuda.py runs every algorithm on one), and on a CPU tensor it is a
   zero-copy view that code may take in a branch for CPU tensors.

Both run on the C path and on the torch path (``ops.use_torch_ops``, what GPUs run
without CUDA kernels); the algorithm list comes from the registry, so a new algorithm
is checked by registering. The last tests show the checks catch what they are meant to.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

import sparsecomm as sc
from sparsecomm import algorithms, ops
from sparsecomm.algorithms import base as algorithm_base
from sparsecomm.algorithms.topka import TopkAllgather as TopkA
from sparsecomm.comm import simulate

from _reference import make_gradients

P, N, DENSITY = 4, 20_000, 0.01
WATCH_N, WATCH_DENSITY = 100_000, 0.02  # k = 2000: k values (8 KB) exceed HOST_BYTES
HOST_BYTES = 4096 + 64 * P
EXTRA_OPTIONS = {"topkdsa": [{"quantize_bits": 4, "bucket_size": 64}], "gssgd": [{"heavymix": "random"},
                                                                                 {"estimate": "full", "allreduce": "tree", "p1": None}]}
MATRIX = [(name, options) for name in algorithms.names() for options in [{}] + EXTRA_OPTIONS.get(name, [])]
PATHS = {"c": contextlib.nullcontext, "torch": ops.use_torch_ops}


#: factory functions whose device must be named (the ``*_like`` ones follow their input;
#: ``from_numpy`` / ``frombuffer`` make host tensors by definition)
FACTORIES = {torch.zeros, torch.empty, torch.ones, torch.full, torch.arange, torch.tensor, torch.as_tensor,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye, torch.empty_strided}


_TORCH_DIR = os.path.dirname(torch.__file__)


class _DevicelessFactories(TorchFunctionMode):
    """Records every factory call made from sparsecomm's code without ``device=``."""

    def __init__(self, found: list):
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            caller = traceback.extract_stack(limit=2)[0]
            if not caller.filename.startswith(_TORCH_DIR):  # sparsecomm's (or an algorithm's) call
                self.found.append(f"{caller.filename.rsplit('/', 2)[-2:]}:{caller.lineno} {caller.line}")
        return func(*args, **kwargs)


def _run(name, options, dtype=torch.float32, default_device=None, steps=2, watch=None, deviceless=None,
         n=N, density=DENSITY):
    """Every rank runs ``steps`` reducer calls (simulated P ranks). ``default_device``: torch's
    default device inside the calls; ``deviceless``: a list collecting factory calls without a
    device; ``watch``: a _HostWatch, recording from the second call on (the first holds the
    once-per-tensor handshake)."""
    grads = [make_gradients("random", n, P, step, dtype, seed=3) for step in range(steps)]

    def rank(comm):
        reducer = sc.SparseAllreduce(name, density, comm=comm, **options)
        outs = []
        for step in range(steps):
            grad = grads[step][comm.rank].clone()
            if watch is not None:
                watch.local.on = step >= 1
            with contextlib.ExitStack() as stack:  # modes are per thread: entered on the rank's own
                if default_device:
                    stack.enter_context(torch.device(default_device))
                if deviceless is not None:
                    stack.enter_context(_DevicelessFactories(deviceless))
                out = reducer(grad)
            if watch is not None:
                watch.local.on = False
            outs.append((out.clone(), reducer.residual.clone()))
        return outs

    return simulate(P, rank).results


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,options", MATRIX, ids=[f"{n}-{o}" if o else n for n, o in MATRIX])
def test_every_allocation_names_its_device(name, options, path):
    deviceless: list[str] = []
    with PATHS[path]():
        want = _run(name, options)
        got = _run(name, options, default_device="meta", deviceless=deviceless)
    assert not deviceless, sorted(set(deviceless))
    for r in range(P):
        for (out, res), (w_out, w_res) in zip(got[r], want[r]):
            assert out.device.type == "cpu" and res.device.type == "cpu"
            assert torch.equal(out, w_out) and torch.equal(res, w_res)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_gradients_allocate_on_their_device(dtype):
    want = _run("topka", {}, dtype)
    got = _run("topka", {}, dtype, default_device="meta")
    assert all(torch.equal(a[0], b[0]) for r in range(P) for a, b in zip(got[r], want[r]))


class _HostWatch:
    """Records the bytes and the sparsecomm caller of every Tensor.cpu / numpy / tolist."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, str]] = []
        self.local = threading.local()
        for method in ("cpu", "tolist"):
            real = getattr(torch.Tensor, method)
            monkeypatch.setattr(torch.Tensor, method, self._wrap(real))

    def _wrap(self, real):
        watch = self

        def method(t, *args, **kwargs):
            if not getattr(watch.local, "on", False):
                return real(t, *args, **kwargs)
            frames = [f for f in traceback.extract_stack()[:-1] if "/sparsecomm/" in f.filename.replace("\\", "/")]
            if frames:
                where = f"{frames[-1].filename.rsplit('/', 2)[-2:]}:{frames[-1].lineno} {frames[-1].line}"
                watch.calls.append((t.numel() * t.element_size(), where))
            return real(t, *args, **kwargs)

        return method

    def large(self, limit: int) -> list[tuple[int, str]]:
        return sorted({c for c in self.calls if c[0] > limit}, reverse=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,options", MATRIX, ids=[f"{n}-{o}" if o else n for n, o in MATRIX])
def test_nothing_large_goes_to_the_host(name, options, path, monkeypatch):
    watch = _HostWatch(monkeypatch)
    with PATHS[path]():
        _run(name, options, steps=3, watch=watch, n=WATCH_N, density=WATCH_DENSITY)
    assert not watch.large(HOST_BYTES), watch.large(HOST_BYTES)[:5]


# ------------------------------------------------------------------ the checks can fail

class _CarelessTopkA(TopkA):
    """topka with a device-less buffer and a host round trip of the whole accumulator."""

    name = "_careless_topka"
    fault = "alloc"

    def reduce(self, acc, k, out):
        if self.fault == "alloc":
            scratch = torch.zeros(acc.numel())  # no device=: the fault the rule forbids
            scratch.add_(acc)
        elif self.fault == "alloc-used":
            staged = torch.zeros(acc.numel())  # a device-less buffer the result flows through
            super().reduce(acc, k, staged)
            out.copy_(staged)
            return
        else:
            acc.copy_(acc.cpu())
        super().reduce(acc, k, out)


@pytest.mark.parametrize("fault", ["alloc", "host"])
def test_the_checks_catch_a_careless_algorithm(fault, monkeypatch):
    monkeypatch.setitem(algorithm_base._REGISTRY, _CarelessTopkA.name, _CarelessTopkA)
    monkeypatch.setattr(_CarelessTopkA, "fault", fault)
    if fault == "alloc":
        deviceless: list[str] = []
        _run(_CarelessTopkA.name, {}, deviceless=deviceless)
        assert any("torch.zeros(acc.numel())" in f for f in deviceless), deviceless
        with pytest.raises(Exception, match="meta"):  # the meta default catches it when used
            monkeypatch.setattr(_CarelessTopkA, "fault", "alloc-used")
            _run(_CarelessTopkA.name, {}, default_device="meta")
    else:
        watch = _HostWatch(monkeypatch)
        _run(_CarelessTopkA.name, {}, watch=watch, n=WATCH_N, density=WATCH_DENSITY)
        assert watch.calls and watch.large(HOST_BYTES), "an N-sized .cpu() went unnoticed"
