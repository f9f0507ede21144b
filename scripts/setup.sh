#!/usr/bin/env bash
# Set up a development environment for sparsecomm on a fresh Debian machine:
#   system packages (Open MPI for the MPI backend and tests, iproute2 for emulated links),
#   a virtual environment in .venv with torch 2.13.0 (pinned: an unpinned torch pulls
#   several GB of CUDA wheels), and sparsecomm itself installed in editable mode.
# Idempotent: re-running only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Open MPI and iproute2 with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev iproute2 >/dev/null
  else
    echo "setup: Open MPI not found and cannot apt-get it (not root): MPI tests will be skipped"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
# scikit-learn: the digits data set of examples/train_digits.py ships inside its wheel;
# matplotlib: plots of `python -m sparsecomm.bench` and of the demo (demo_results/demo.png)
if ! "$VENV/bin/python" -c "import torch, numpy, pytest, tqdm, sklearn, matplotlib" >/dev/null 2>&1; then
  echo "setup: installing $TORCH_SPEC numpy pytest tqdm scikit-learn matplotlib"
  $PIP install -q "$TORCH_SPEC" numpy pytest tqdm scikit-learn matplotlib
fi
if command -v mpicc >/dev/null 2>&1 && ! "$VENV/bin/python" -c "import mpi4py" >/dev/null 2>&1; then
  echo "setup: installing mpi4py"
  $PIP install -q "mpi4py>=3.1"
fi
# the frameworks of sparsecomm.integrations (tests/test_lightning.py, tests/test_accelerate.py),
# installed with the pinned torch on the same command line so pip cannot swap it for another build
if ! "$VENV/bin/python" -c "import lightning, accelerate" >/dev/null 2>&1; then
  echo "setup: installing lightning and accelerate (keeping $TORCH_SPEC)"
  $PIP install -q "$TORCH_SPEC" "lightning==2.6.6" "accelerate==1.15.0"
fi
echo "setup: building and installing sparsecomm (editable)"
# --no-build-isolation: compile against the torch in this venv (see _build/backend.py)
$PIP install -q --no-build-isolation -e .
"$VENV/bin/python" -c "import sparsecomm, torch; print('setup: sparsecomm', sparsecomm.__version__, 'with torch', torch.__version__, '-', ', '.join(sparsecomm.algorithms.names()))"
