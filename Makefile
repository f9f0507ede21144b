# sparsecomm developer commands. `make demo` and `make test` work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast test-fallback bench clean ctest sanitize fuzz fuzz-build setup-sanitizers cuda-check

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) examples/ddp_demo.py

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q tests -m "not mpi"

# The GPU fallback path (ops/_torch_impl/) in place of the C kernels on CPU tensors: every
# algorithm's test file and the stream, sketch and wire files run with SPARSECOMM_OPS=torch on
# simulated ranks (docs/architecture.md, "Devices"); the ops' own files are left out because
# tests/test_torch_fallback.py in `make test` compares every op with the C kernel. About 10 min
# on a loaded 2-core machine (2 min of CPU).
FALLBACK_TESTS := tests/test_algorithms.py tests/test_spardl.py tests/test_sparcml.py tests/test_gtopk.py \
	tests/test_gssgd.py tests/test_oktopk.py tests/test_stream.py tests/test_sketch.py tests/test_wire.py
test-fallback: setup
	SPARSECOMM_OPS=torch $(PY) -m pytest -q -p no:cacheprovider $(FALLBACK_TESTS) -m "not mpi and not distributed and not slow" -k "not gloo"

bench: setup
	$(PY) benchmarks/bench_kernels.py

clean:
	rm -rf build *.egg-info sparsecomm/*.so

# ---------------------------------------------------------------- C tests, sanitizers, fuzzing
# Standalone C builds of the kernels (csrc/cpu), no torch: docs/fuzzing.md.
#   make ctest                  C tests (csrc/tests/test_*.c, one binary each), plain -O2 -fopenmp build
#   make sanitize               the same tests under ASan + UBSan (gcc, OpenMP on)
#   make fuzz [FUZZ_RUNS=n] [FUZZ_TIME=s]
#                               every libFuzzer target (csrc/fuzz) from its seed corpus,
#                               FUZZ_RUNS runs or FUZZ_TIME seconds each, whichever first
# clang + libFuzzer come from scripts/setup_sanitizers.sh (make setup-sanitizers).
CC_TEST ?= gcc
CLANG ?= clang
FUZZ_RUNS ?= 200000
FUZZ_TIME ?= 60
KERNEL_SRC := $(sort $(wildcard csrc/cpu/*.c))
KERNEL_HDR := $(wildcard csrc/cpu/*.h csrc/include/sparsecomm/*.h)
CTEST_SRC := $(sort $(wildcard csrc/tests/*.c))
CTEST_HDR := $(wildcard csrc/tests/*.h)
CTEST_FLAGS := -std=gnu11 -g -fopenmp -Wall -Wno-unknown-pragmas -Icsrc/include -Icsrc/cpu
SAN_FLAGS := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
FUZZ_TARGETS := $(sort $(patsubst csrc/fuzz/fuzz_%.c,%,$(wildcard csrc/fuzz/fuzz_*.c)))
FUZZ_CFLAGS := -std=gnu11 -g -O2 -Wall -Wno-unknown-pragmas -Icsrc/include -Icsrc/cpu \
	-fno-sanitize-recover=undefined
FUZZ_OBJ := $(patsubst csrc/cpu/%.c,build/fuzz/obj/%.o,$(KERNEL_SRC))
# kept between builds (make would delete them as intermediates of the fuzz_% rule)
.SECONDARY: $(FUZZ_OBJ)

setup-sanitizers:
	bash scripts/setup_sanitizers.sh

# one binary per csrc/tests/test_*.c (each has its own main)
CTEST_NAMES := $(patsubst csrc/tests/%.c,%,$(CTEST_SRC))

build/ctest/%: csrc/tests/%.c $(CTEST_HDR) $(KERNEL_SRC) $(KERNEL_HDR)
	@mkdir -p $(@D)
	$(CC_TEST) $(CTEST_FLAGS) -O2 $< $(KERNEL_SRC) -lm -o $@

build/sanitize/%: csrc/tests/%.c $(CTEST_HDR) $(KERNEL_SRC) $(KERNEL_HDR)
	@mkdir -p $(@D)
	$(CC_TEST) $(CTEST_FLAGS) $(SAN_FLAGS) $< $(KERNEL_SRC) -lm -o $@

ctest: $(addprefix build/ctest/,$(CTEST_NAMES))
	@set -e; for t in $^; do OMP_NUM_THREADS=4 $$t; done

sanitize: $(addprefix build/sanitize/,$(CTEST_NAMES))
	@set -e; for t in $^; do $(SAN_ENV) OMP_NUM_THREADS=4 $$t; done

# Comparison tracing (libFuzzer's guidance for magic values) on the kernels that parse
# peer bytes; top-k and the sketch loop over histograms and tables whose traced
# comparisons would cost most of each execution (3x slower), so they go without.
FUZZ_NO_CMP := -fno-sanitize-coverage=trace-cmp
build/fuzz/obj/topk.o build/fuzz/obj/sketch.o: FUZZ_OBJ_EXTRA := $(FUZZ_NO_CMP)

build/fuzz/obj/%.o: csrc/cpu/%.c $(KERNEL_HDR)
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined $(FUZZ_OBJ_EXTRA) -c $< -o $@

build/fuzz/fuzz_%: csrc/fuzz/fuzz_%.c csrc/fuzz/fuzz_common.h csrc/tests/ref.h $(FUZZ_OBJ)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined $< $(FUZZ_OBJ) -lm -o $@

fuzz-build: $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))

# Each target runs from a scratch copy of its seed corpus (build/fuzz/work/<target>), so
# the committed seeds stay as scripts/make_fuzz_corpus.py wrote them; a finding is saved
# as build/fuzz/artifacts/<target>-crash-* and fails the make.
fuzz: fuzz-build
	@mkdir -p build/fuzz/artifacts
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/work/$$t; \
	  if build/fuzz/fuzz_$$t -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
	      -artifact_prefix=build/fuzz/artifacts/$$t- build/fuzz/work/$$t csrc/fuzz/corpus/$$t \
	      > build/fuzz/$$t.log 2>&1; then \
	    printf 'fuzz %-8s %s runs, %s exec/s, cov %s, corpus %s, 0 findings\n' $$t \
	      "$$(sed -n 's/^stat::number_of_executed_units: *//p' build/fuzz/$$t.log)" \
	      "$$(sed -n 's/^stat::average_exec_per_sec: *//p' build/fuzz/$$t.log)" \
	      "$$(grep -o 'cov: [0-9]*' build/fuzz/$$t.log | tail -n 1 | cut -d' ' -f2)" \
	      "$$(grep -o 'corp: [0-9]*' build/fuzz/$$t.log | tail -n 1 | cut -d' ' -f2)"; \
	  else \
	    tail -n 60 build/fuzz/$$t.log; echo "fuzz $$t: FINDING (log build/fuzz/$$t.log)"; exit 1; \
	  fi; \
	done

# ---------------------------------------------------------------- CUDA compile check
# Every csrc/cuda/*.cu compiled by nvcc alone for sm_80 and sm_90, to object files only (the
# kernels see no torch: C ABI in csrc/include/sparsecomm/cuda.h), warnings as errors. No GPU
# needed; skipped with a message when nvcc is absent. Building and running them: scripts/gpu_check.sh.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_SRC := $(sort $(wildcard csrc/cuda/*.cu))
CUDA_HDR := $(wildcard csrc/cuda/*.cuh) csrc/include/sparsecomm/cuda.h $(wildcard csrc/include/sparsecomm/*.h)
CUDA_ARCHS := 80 90
NVCC_FLAGS := -std=c++17 -O3 --fmad=false -Icsrc/include -Werror all-warnings
CUDA_OBJ := $(foreach a,$(CUDA_ARCHS),$(patsubst csrc/cuda/%.cu,build/cuda-check/sm_$(a)/%.o,$(CUDA_SRC)))

define cuda_arch_rule
build/cuda-check/sm_$(1)/%.o: csrc/cuda/%.cu $$(CUDA_HDR)
	@mkdir -p $$(@D)
	$$(NVCC) $$(NVCC_FLAGS) -gencode=arch=compute_$(1),code=sm_$(1) -c $$< -o $$@
endef
$(foreach a,$(CUDA_ARCHS),$(eval $(call cuda_arch_rule,$(a))))

cuda-check:
	@if [ -z "$(NVCC)" ]; then \
	  echo "cuda-check: SKIPPED: nvcc not found (install the CUDA toolkit or set NVCC=/path/to/nvcc)"; \
	else \
	  $(MAKE) --no-print-directory $(CUDA_OBJ) && \
	  echo "cuda-check: $(words $(CUDA_SRC)) .cu files compiled for sm_80 and sm_90 with $$($(NVCC) --version | tail -n 1)"; \
	fi
