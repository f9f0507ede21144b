"""Communication layer: the :class:`Comm` interface and its backends.

* :class:`TorchComm` -- torch.distributed point-to-point (gloo, NCCL, MPI backends)
* :class:`MPIComm` -- mpi4py, buffer-based calls only
* :func:`simulate` -- P ranks in one process with an alpha-beta time model
"""

from .base import Comm, CommError, CommStats, CommTimeoutError, ring_allreduce_cost
from .collectives import bruck_allgather, bruck_allgather_var, halving_allreduce_, halving_tree
from .simulated import GBIT_BETA, SimComm, SimulationResult, simulate
from .topology import NodeComms, Topology

__all__ = [
    "Comm", "CommError", "CommStats", "CommTimeoutError", "ring_allreduce_cost",
    "bruck_allgather", "bruck_allgather_var", "halving_allreduce_", "halving_tree",
    "SimComm", "SimulationResult", "simulate", "GBIT_BETA", "Topology", "NodeComms",
    "TorchComm", "MPIComm",
]


def __getattr__(name: str):
    # TorchComm and MPIComm are imported on first use: MPIComm needs mpi4py (optional extra)
    if name == "TorchComm":
        from .torch_comm import TorchComm
        return TorchComm
    if name == "MPIComm":
        from .mpi_comm import MPIComm
        return MPIComm
    raise AttributeError(f"module 'sparsecomm.comm' has no attribute {name!r}")
