#!/usr/bin/env bash
# The whole GPU check of sparsecomm in one command (docs/kernels.md, "GPU"):
#
#   bash scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu_check_results)
#
# On a machine with a CUDA GPU, a torch built with CUDA and nvcc:
#   0. checks that extensions built with this machine's compiler raise C++ errors as Python
#      exceptions (scripts/extension_toolchain_check.py), else switches to /usr/bin/g++;
#   1. builds the extension without the CUDA kernels and runs tests/test_cuda.py: every op's
#      torch implementation on CUDA against the CPU kernel, every algorithm on CUDA tensors
#      (simulated P up to 16 on the one GPU, NCCL at P = 1), the DDP hook on a GPU model, the
#      FSDP2 hook on FSDP's CUDA all-reduce stream (its result must be the sharded gradient);
#   2. rebuilds with the CUDA kernels (SPARSECOMM_CUDA_KERNELS=1, the default where nvcc
#      exists) and runs the same tests against them (bit for bit), plus the device rules;
#   3. runs benchmarks/bench_cuda.py (top-k against torch.topk and one HBM read pass at
#      N = 25M..140M, merge and sketch throughput).
# Everything it prints goes to OUT_DIR too (summary.txt, one log per step, bench_cuda.json).
# Exit status 0 only if every step passed. PYTHON selects the interpreter (default python3).
# The last build left in place is the one with the CUDA kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-gpu_check_results}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0

say() { echo "$*" | tee -a "$SUMMARY"; }
step() {  # step NAME COMMAND...: run, log to OUT/NAME.log, record pass/fail
  local name=$1; shift
  local start=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then
    say "PASS $name ($((SECONDS - start)) s)"
  else
    say "FAIL $name ($((SECONDS - start)) s): see $OUT/$name.log"; tail -n 30 "$OUT/$name.log"; status=1
  fi
}

say "sparsecomm GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  say "FAIL: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1))"
  exit 1
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
say "$("$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)')"
say "$( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | head -n 1): $(nvcc --version 2>/dev/null | tail -n 1)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rs)

export MAX_JOBS=${MAX_JOBS:-$(nproc)}  # parallel compiles (torch's BuildExtension with ninja)

# 0. a toolchain whose extensions raise their errors: one image's default g++ (a wrapper in
#    /opt/gcc) builds extensions that crash on every C++ exception; its /usr/bin/g++ works
if "$PY" scripts/extension_toolchain_check.py > "$OUT/toolchain.log" 2>&1; then
  say "PASS toolchain (${CXX:-default c++})"
elif [ -x /usr/bin/g++ ] && CXX=/usr/bin/g++ CC=/usr/bin/gcc "$PY" scripts/extension_toolchain_check.py >> "$OUT/toolchain.log" 2>&1; then
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc
  say "PASS toolchain: the default compiler's extensions crash on C++ exceptions; building with /usr/bin/g++"
else
  say "FAIL toolchain: extensions built here crash or do not raise (see $OUT/toolchain.log)"; status=1
fi

# 1. the torch implementations on CUDA (what users get without the CUDA kernels)
step build_torch_impl env SPARSECOMM_CUDA_KERNELS=0 "$PY" setup.py -q build_ext --inplace --force
step check_torch_impl "$PY" -c "import sparsecomm.ops as o; assert not o.CUDA_KERNELS; print('torch implementations on CUDA')"
step tests_torch_impl "${PYTEST[@]}" tests/test_cuda.py

# 2. the CUDA kernels
step nvcc_compile make cuda-check
step build_cuda_kernels env SPARSECOMM_CUDA_KERNELS=1 "$PY" setup.py -q build_ext --inplace --force
step check_cuda_kernels "$PY" -c "import sparsecomm.ops as o; assert o.CUDA_KERNELS, 'built without the CUDA kernels'; print('CUDA kernels registered')"
step tests_cuda_kernels "${PYTEST[@]}" tests/test_cuda.py tests/test_device_rules.py tests/test_torch_fallback.py

# 3. throughput
step bench_cuda "$PY" benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
cat "$OUT/bench_cuda.log" >> "$SUMMARY" 2>/dev/null || true

if [ $status -eq 0 ]; then say "GPU CHECK PASSED"; else say "GPU CHECK FAILED"; fi
exit $status
