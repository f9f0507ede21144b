# sparsecomm developer commands. `make demo` and `make test` work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench clean

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) examples/ddp_demo.py

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q tests -m "not mpi"

bench: setup
	$(PY) benchmarks/bench_kernels.py

clean:
	rm -rf build *.egg-info sparsecomm/*.so
