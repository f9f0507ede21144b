#!/usr/bin/env bash
# Set up a development environment for sparsecomm on a fresh Debian machine:
#   system packages (Open MPI for the MPI backend and tests, iproute2 for emulated links),
#   a virtual environment in .venv with torch 2.13.0 (pinned: an unpinned torch pulls
#   several GB of CUDA wheels), and sparsecomm itself installed in editable mode.
# Idempotent: re-running only does what is missing, in seconds. The C/C++ extension is
# compiled again only when what it is built from changed (scripts/build_stamp.py).
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
# whether the venv has these modules, without importing them (torch and lightning take seconds)
have() {
  "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "$@"
}
# scikit-learn: the digits data set of examples/train_digits.py ships inside its wheel;
# matplotlib: plots of `python -m sparsecomm.bench` and of the demo (demo_results/demo.png)
if ! have torch numpy pytest tqdm sklearn matplotlib; then
  echo "setup: installing $TORCH_SPEC numpy pytest tqdm scikit-learn matplotlib"
  $PIP install -q "$TORCH_SPEC" numpy pytest tqdm scikit-learn matplotlib
fi
if command -v mpicc >/dev/null 2>&1 && ! have mpi4py; then
  echo "setup: installing mpi4py"
  $PIP install -q "mpi4py>=3.1"
fi
# the frameworks of sparsecomm.integrations (tests/test_lightning.py, tests/test_accelerate.py),
# installed with the pinned torch on the same command line so pip cannot swap it for another build
if ! have lightning accelerate; then
  echo "setup: installing lightning and accelerate (keeping $TORCH_SPEC)"
  $PIP install -q "$TORCH_SPEC" "lightning==2.6.6" "accelerate==1.15.0"
fi
# The editable install imports sparsecomm from this checkout, so an edit to sparsecomm/*.py needs
# nothing here; the extension (csrc/, setup.py, _build/) is compiled against this venv's torch
# again only when its sources, torch, Python or the build's variables changed, or the built
# sparsecomm/_C*.so is missing or does not load (the record: $STAMP, written after each build).
STAMP="$VENV/.sparsecomm-build.json"
if current=$("$VENV/bin/python" scripts/build_stamp.py check "$STAMP"); then
  echo "setup: $current, built and up to date"
else
  echo "setup: building the C/C++ extension and installing sparsecomm (editable): about 3-5 min on 2 free cores"
  echo "setup:   because: $current"
  log=build/setup-build.log
  started=$SECONDS
  # --no-build-isolation: compile against the torch in this venv (see _build/backend.py);
  # -v and unbuffered so that each compile is seen as it starts (one progress line each)
  if ! PYTHONUNBUFFERED=1 $PIP install -v --no-build-isolation -e . 2>&1 |
      "$VENV/bin/python" scripts/build_stamp.py progress "$log"; then
    # the compiler's errors when there are any (they may be far from the end), else pip's last words
    errors=$(grep -E -A2 ': (fatal )?error:' "$log" | head -n 40 || true)
    if [ -n "$errors" ]; then echo "$errors"; else tail -n 40 "$log"; fi
    echo "setup: building sparsecomm failed; the whole output is in $log"
    exit 1
  fi
  "$VENV/bin/python" scripts/build_stamp.py write "$STAMP"
  took=$((SECONDS - started))
  "$VENV/bin/python" -c "import sparsecomm, torch; print('setup: sparsecomm', sparsecomm.__version__, 'with torch', torch.__version__, '-', ', '.join(sparsecomm.algorithms.names()), '(built in $((took / 60)) min $((took % 60)) s)')"
fi
if [ "${VIRTUAL_ENV:-}" != "$(cd "$VENV" && pwd)" ]; then
  echo "setup: to use it in this shell: source $VENV/bin/activate (then python, pytest, ... are the venv's)"
fi
