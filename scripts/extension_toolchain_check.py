"""Does a torch C++ extension built with this machine's compiler raise its errors as Python
exceptions? (``scripts/gpu_check.sh`` runs it before building sparsecomm.)

    python scripts/extension_toolchain_check.py        (CXX / CC select the compiler)

Builds two one-line extensions in a fresh directory, one through pybind11 and one through the
torch dispatcher (as sparsecomm's ops are), and calls each so that it throws
``TORCH_CHECK_VALUE``. Exit status 0 when both arrive as ValueError. A toolchain whose C++
runtime does not match torch's crashes here (SIGSEGV while formatting the message): one GPU
image's wrapper of g++ in /opt/gcc did; its /usr/bin/g++ did not.
"""

import shutil
import sys
import tempfile

import torch
from torch.utils.cpp_extension import load_inline

PYBIND_SOURCE = r"""
#include <torch/extension.h>
void fails(int64_t k) { TORCH_CHECK_VALUE(k > 0, "k must be > 0, got ", k); }
"""
DISPATCHER_SOURCE = r"""
#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor fails(const at::Tensor& x) { TORCH_CHECK_VALUE(false, "raised with ", x.numel(), " elements"); return x; }
TORCH_LIBRARY(sc_toolchain_check, m) { m.def("fails(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(sc_toolchain_check, CPU, m) { m.impl("fails", &fails); }
"""


def main() -> int:
    build = tempfile.mkdtemp(prefix="sc_toolchain_")
    try:
        module = load_inline("sc_toolchain_pybind", cpp_sources=PYBIND_SOURCE, functions=["fails"],
                             build_directory=build)
        try:
            module.fails(-1)
            print("FAIL: the pybind11 extension did not raise")
            return 1
        except ValueError as exc:
            print(f"pybind11 extension raised ValueError: {exc}")
        dispatcher_build = tempfile.mkdtemp(dir=build)
        load_inline("sc_toolchain_dispatcher", cpp_sources=DISPATCHER_SOURCE, is_python_module=False,
                    build_directory=dispatcher_build)
        try:
            torch.ops.sc_toolchain_check.fails(torch.ones(3))
            print("FAIL: the dispatcher op did not raise")
            return 1
        except ValueError as exc:
            print(f"dispatcher op raised ValueError: {str(exc).splitlines()[0]}")
        return 0
    finally:
        shutil.rmtree(build, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
