"""One rank of a 2 x 2 two-level job under ``python -m sparsecomm.launch`` (tests/test_two_level.py):
rank 0, which hosts the store of every Comm, raises inside a call -- in the round on the world Comm
(its agreement record), on the node's Comm, or in the algorithm between nodes (argv[1]: world,
intra, between) -- and every rank prints ``<seconds>s <error type>: <message>``, the seconds from
the failing call's start to the error it raised."""

import sys
import time

import torch
import torch.distributed as dist

import sparsecomm as sc
from sparsecomm.comm.torch_comm import TorchComm


def _boom(*args, **kwargs):
    raise ValueError("injected failure on the store host")


def main(where: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    comm = TorchComm(timeout=60)
    nodes = sc.Topology.from_env().split(comm)
    reducer = sc.SparseAllreduce("topka", 0.01, comm=comm, hierarchy="node", nodes=nodes)
    grad = torch.randn(100_000, generator=torch.Generator().manual_seed(rank))
    reducer(grad)
    dist.barrier()
    if rank == 0:
        if where == "world":
            reducer.comm.allgather_small = _boom
        elif where == "intra":
            nodes.intra.exchange = _boom
        else:
            reducer.algorithm.reduce = _boom
    start = time.monotonic()
    try:
        while time.monotonic() - start < 20:
            reducer(grad)
        print("no error", flush=True)
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        print(f"{time.monotonic() - start:.2f}s {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    # stay until every rank has printed: a rank that leaves would release the others itself
    store = dist.distributed_c10d._get_default_store()
    store.add("printed", 1)
    while int(store.add("printed", 0)) < dist.get_world_size() and time.monotonic() - start < 30:
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1])
