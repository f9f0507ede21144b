import os
import sys

# Make the checkout importable when the package is not installed (pytest from the repo root).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "mpi: runs MPI programs under mpirun (needs Open MPI/MPICH and mpi4py)")
    config.addinivalue_line("markers", "distributed: spawns several torch.distributed (gloo) processes")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; skipped when none is present")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
