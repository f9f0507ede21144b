"""Benchmark of SparCML's algorithms (docs/sparcml.md): a sweep like the paper's Figure 4,
and the overlap of the non-blocking DDP hook.

1. gloo, P ranks (default 4) on this machine: for each density, every algorithm is first
   checked (bit-identical output on every rank, conservation over two steps, on a small
   N), then timed on N = 16M, interleaved round-robin, median of ``--repeats``; reported:
   time per call (slowest rank), its wire part (comm_s), bytes sent per rank, and the
   ratio ``dense time / algorithm time`` (> 1: faster than the dense allreduce).
2. simulated P (default 8): the alpha-beta time (alpha 50 us, 1 Gbit/s) of the same calls,
   i.e. what they cost on the paper's GigE cluster, with the same ratio.
3. DDP hook overlap: per-step time of a model with several buckets on 2 gloo ranks with
   ``async_comm=False`` and ``True``, on the loopback link and on a link with an injected
   latency per round (a sleep in the Comm, standing for a slow network; sleeping takes no
   CPU, so the ranks' compute is what overlaps it).

Usage::

    python benchmarks/bench_sparcml.py                        # everything, N = 16M
    python benchmarks/bench_sparcml.py --n 1M --repeats 3     # quicker
    python benchmarks/bench_sparcml.py --only hook
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- \
        python benchmarks/bench_sparcml.py --only gloo --check-n 10007   # on the emulated GigE cluster
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

try:
    import sparsecomm as sc
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sparsecomm as sc

from sparsecomm.bench.common import bench_gradient, parse_size
from sparsecomm.comm import GBIT_BETA, TorchComm, simulate
from sparsecomm.testing import launched, spawn

ALGS = [("dense", "dense", {}), ("recursive_double", "sparcml_recursive_double", {}),
        ("split_allgather", "sparcml_split_allgather", {}), ("topkdsa", "topkdsa", {}),
        ("topkdsa q4", "topkdsa", {"quantize_bits": 4}), ("sparcml", "sparcml", {})]
DENSITIES = [0.001, 0.005, 0.01, 0.05, 0.1]


def _sweep_rank(rank, size, n, densities, repeats, check_n):
    torch.set_num_threads(1)
    comm = TorchComm()
    checks, times = {}, {}
    for density in densities:
        for label, alg, opts in ALGS:  # correctness first, on a small N
            red = sc.SparseAllreduce(alg, density, comm=comm, **opts)
            rows = []
            for step in range(2):
                g = bench_gradient(rank, step, check_n)
                before = red.residual.clone() if red.residual is not None else torch.zeros(check_n)
                out = red(g.clone())
                rows.append((g.numpy(), before.numpy(), out.clone().numpy(), red.residual.clone().numpy()))
            checks[(density, label)] = rows
        reds = {label: sc.SparseAllreduce(alg, density, comm=comm, **opts) for label, alg, opts in ALGS}
        grads = [bench_gradient(rank, s, n) for s in range(2)]
        for label in reds:  # warm-up: handshake, first-call allocations
            reds[label](grads[0].clone())
        for rep in range(repeats):
            for label, red in reds.items():
                g = grads[rep % 2].clone()
                comm.barrier()
                t0 = time.perf_counter()
                red(g)
                dt = time.perf_counter() - t0
                st = red.last_stats
                times.setdefault((density, label), []).append((dt, st["comm_s"], st["bytes_sent"]))
    return checks, times


def _check(size, all_checks):
    for key in all_checks[0]:
        for step in range(2):
            outs = [all_checks[r][key][step][2] for r in range(size)]
            if not all((o == outs[0]).all() for o in outs):
                raise AssertionError(f"{key}: ranks disagree")
            total_in = sum(all_checks[r][key][step][0].astype(np.float64) + all_checks[r][key][step][1]
                           for r in range(size))
            total_out = outs[0].astype(np.float64) + sum(all_checks[r][key][step][3] for r in range(size))
            err = np.abs(total_in - total_out).max()
            if err > 1e-4 * max(1.0, np.abs(total_in).max()):
                raise AssertionError(f"{key} step {step}: conservation off by {err}")


def _gather_launched(local, size):
    """Under ``python -m sparsecomm.launch``: all-gather every rank's checks and timings as
    plain tensors (nothing pickled between ranks) and rebuild spawn()'s result list."""
    import torch.distributed as dist
    checks, times = local
    ckeys, tkeys = list(checks), list(times)
    c = torch.from_numpy(np.stack([np.stack([np.stack(step).astype(np.float64) for step in checks[key]])
                                   for key in ckeys]))
    t = torch.tensor([times[key] for key in tkeys], dtype=torch.float64)
    call = [torch.empty_like(c) for _ in range(size)]
    tall = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(call, c)
    dist.all_gather(tall, t)
    return [({key: [tuple(step.numpy()) for step in call[r][i]] for i, key in enumerate(ckeys)},
             {key: [tuple(rep.tolist()) for rep in tall[r][i]] for i, key in enumerate(tkeys)})
            for r in range(size)]


def gloo_sweep(size, n, densities, repeats, check_n):
    under_launcher = launched()
    if under_launcher:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        size = dist.get_world_size()
        res = _gather_launched(_sweep_rank(dist.get_rank(), size, n, densities, repeats, check_n), size)
        rank = dist.get_rank()
        dist.barrier()
        dist.destroy_process_group()  # a clean exit: gloo's threads stopped before teardown
        if rank != 0:
            return False
    else:
        res = spawn(_sweep_rank, size, n, densities, repeats, check_n, timeout=3000)
    _check(size, [r[0] for r in res])
    where = "emulated 1 Gbit/s cluster (sparsecomm.launch)" if under_launcher else "loopback"
    print(f"\n## gloo, P = {size}, {where}, N = {n:,} float32 (checked: bit-identical, conservation)\n")
    print("| density | algorithm | time ms | wire ms | MB sent/rank | dense time / time |")
    print("|---|---|---|---|---|---|")
    for density in densities:
        med = {}
        for label, _, _ in ALGS:
            runs = list(zip(*[r[1][(density, label)] for r in res]))  # per repeat, all ranks
            med[label] = (statistics.median(max(x[0] for x in rep) for rep in runs),
                          statistics.median(max(x[1] for x in rep) for rep in runs),
                          max(x[2] for x in runs[0]))
        for label, _, _ in ALGS:
            t, w, b = med[label]
            print(f"| {density} | {label} | {t * 1e3:.1f} | {w * 1e3:.1f} | {b / 1e6:.2f} | "
                  f"{med['dense'][0] / t:.2f} |")
    return True


def sim_sweep(size, n, densities):
    print(f"\n## simulated, P = {size}, N = {n:,} float32, alpha = 50 us, 1 Gbit/s (modelled wire time)\n")
    print("| density | algorithm | modelled ms | MB sent/rank | rounds | dense / algorithm | sparcml chose |")
    print("|---|---|---|---|---|---|---|")
    grads = {}
    for density in densities:
        rows = {}
        for label, alg, opts in ALGS:
            def fn(comm, alg=alg, opts=opts, density=density):
                g = grads.setdefault((comm.rank, 0), bench_gradient(comm.rank, 0, n))
                red = sc.SparseAllreduce(alg, density, comm=comm, **opts)
                red(g.clone())
                t0 = comm.clock
                red(g.clone())
                choice = getattr(red.algorithm, "last_choice", "")
                return comm.clock - t0, red.last_stats["bytes_sent"], red.last_stats["rounds"], choice
            r = simulate(size, fn, alpha=50e-6, beta=GBIT_BETA, timeout=3000).results
            rows[label] = (max(x[0] for x in r), max(x[1] for x in r), max(x[2] for x in r), r[0][3])
        for label, _, _ in ALGS:
            t, b, rounds, choice = rows[label]
            print(f"| {density} | {label} | {t * 1e3:.2f} | {b / 1e6:.2f} | {rounds} | {rows['dense'][0] / t:.2f} | "
                  f"{choice or ''} |")


class _DelayComm(TorchComm):
    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def _post_and_wait(self, sends, recvs):
        if self.delay:
            time.sleep(self.delay)
        return super()._post_and_wait(sends, recvs)


def _hook_rank(rank, size, delay, steps, algorithm, density):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    out = {}
    for async_comm in (False, True, False, True):
        model = DDP(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())]),
                    bucket_cap_mb=1)
        state = sc.DDPHookState(algorithm, density, comm=_DelayComm(delay), async_comm=async_comm)
        model.register_comm_hook(state, sc.ddp_hook)
        x = torch.randn(256, 512)
        ts = []
        for step in range(steps):
            t0 = time.perf_counter()
            model(x).square().mean().backward()
            ts.append(time.perf_counter() - t0)
        out.setdefault(async_comm, []).extend(ts[2:])
        state.close()
    return {k: statistics.median(v) for k, v in out.items()}


def hook_overlap(steps, algorithm, density):
    print(f"\n## DDP hook overlap, 2 gloo ranks, 6 x Linear(512, 512) (~1 MB buckets), {algorithm} "
          f"density {density}\n")
    print("| injected latency per round | sync step ms | async step ms | sync / async |")
    print("|---|---|---|---|")
    for delay in (0.0, 0.002, 0.005):
        res = spawn(_hook_rank, 2, delay, steps, algorithm, density, timeout=600)
        s = max(r[False] for r in res)
        a = max(r[True] for r in res)
        print(f"| {delay * 1e3:.0f} ms | {s * 1e3:.1f} | {a * 1e3:.1f} | {s / a:.2f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="16M")
    ap.add_argument("--densities", type=float, nargs="+", default=DENSITIES)
    ap.add_argument("--size", type=int, default=4, help="gloo ranks")
    ap.add_argument("--sim-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check-n", type=int, default=100_003)
    ap.add_argument("--hook-steps", type=int, default=12)
    ap.add_argument("--only", choices=["gloo", "sim", "hook"])
    args = ap.parse_args(argv)
    n = parse_size(args.n)
    print(f"# bench_sparcml: {' '.join(sys.argv[1:]) or '(defaults)'}; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    if args.only in (None, "gloo"):
        if not gloo_sweep(args.size, n, args.densities, args.repeats, args.check_n):
            return  # a launched rank other than 0
    if args.only in (None, "sim"):
        sim_sweep(args.sim_size, n, args.densities)
    if args.only in (None, "hook"):
        hook_overlap(args.hook_steps, "topka", 0.01)


if __name__ == "__main__":
    main()
