"""Build of sparsecomm's extension module sparsecomm._C.

Package metadata lives in pyproject.toml; this file only describes the
extension. It is compiled against the torch installed in the target
environment (see _build/backend.py for how plain `pip install .` finds it).

Layout of the extension:
  csrc/cpu/*.c        C11 + GNU extensions kernels (no torch, no Python), compiled here with the
                      C compiler and C flags only (-std=gnu11 -O3 -fopenmp)
  csrc/ops.cpp        TORCH_LIBRARY binding, compiled by torch's BuildExtension
  csrc/cuda/*.cu      CUDA kernels (C ABI: csrc/include/sparsecomm/cuda.h) and their
  csrc/ops_cuda.cpp   bindings: opt-in until scripts/gpu_check.sh has passed on a GPU, so
                      built only with SPARSECOMM_CUDA_KERNELS=1 (then torch must have CUDA
                      and nvcc must exist, or the build stops and says which is missing);
                      without them CUDA tensors run the torch implementations
"""
import glob
import os
import shutil
import sys

from setuptools import setup

try:
    import torch  # noqa: F401
    from torch.utils.cpp_extension import (
        CUDA_HOME,
        BuildExtension,
        CppExtension,
        CUDAExtension,
    )
except ImportError:
    sys.exit("sparsecomm: PyTorch is required to build the extension: "
             "install torch first, e.g. pip install torch==2.13.0")

HERE = os.path.dirname(os.path.abspath(__file__))


def rel(*parts):
    return os.path.join(*parts)  # setuptools wants paths relative to setup.py



C_SOURCES = sorted(os.path.relpath(p, HERE)
                   for p in glob.glob(os.path.join(HERE, "csrc", "cpu", "*.c")))
CU_SOURCES = sorted(os.path.relpath(p, HERE)
                    for p in glob.glob(os.path.join(HERE, "csrc", "cuda", "*.cu")))
INCLUDE_DIRS = [os.path.join(HERE, "csrc", "include")]
C_FLAGS = ["-std=gnu11", "-O3", "-fopenmp", "-fPIC", "-Wall", "-fno-strict-aliasing"]
CXX_FLAGS = ["-O3", "-fopenmp"]
LINK_FLAGS = ["-fopenmp"]


# nvcc flags of the CUDA kernels: --fmad=false keeps every multiply and add rounded on its
# own, as in the C kernels (results are compared bit for bit); sm_80 (A100) and sm_90 (H100)
# unless TORCH_CUDA_ARCH_LIST says otherwise (torch's BuildExtension reads it).
NVCC_FLAGS = ["-O3", "--fmad=false", "-std=c++17", "-DSPARSECOMM_WITH_CUDA"]
CUDA_ARCHS = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]


def want_cuda():
    """The CUDA kernels are opt-in at build time: SPARSECOMM_CUDA_KERNELS=1 (until
    scripts/gpu_check.sh has passed on a GPU). When asked for, torch must have CUDA and
    nvcc must exist; the build stops with the reason otherwise."""
    if os.environ.get("SPARSECOMM_CUDA_KERNELS", "0") != "1" or os.environ.get("SPARSECOMM_NO_CUDA") == "1":
        return False
    missing = []
    if not CU_SOURCES:
        missing.append("csrc/cuda/*.cu")
    if not torch.version.cuda:
        missing.append(f"a torch built with CUDA (this one is {torch.__version__}, CPU only)")
    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if not (nvcc and os.path.exists(nvcc)) and shutil.which("nvcc") is None:
        missing.append("nvcc (the CUDA toolkit; set CUDA_HOME)")
    if missing:
        sys.exit("sparsecomm: SPARSECOMM_CUDA_KERNELS=1 but the CUDA kernels cannot be built: missing "
                 + "; ".join(missing))
    return True


class BuildExt(BuildExtension):
    """Compiles the C kernels with the C compiler and C flags only.

    torch's BuildExtension compiles every source with C++ flags (-std=c++17,
    and with ninja even with the C++ compiler), which is wrong for C files.
    So the .c files are compiled here first and handed to the link step as
    extra objects.
    """

    def build_extensions(self):
        for ext in self.extensions:
            c_src = getattr(ext, "_sc_c_sources", [])
            if c_src:
                objects = self.compiler.compile(
                    c_src,
                    output_dir=self.build_temp,
                    include_dirs=INCLUDE_DIRS,
                    extra_postargs=C_FLAGS,
                    depends=glob.glob(os.path.join(HERE, "csrc", "cpu", "*.h"))
                    + glob.glob(os.path.join(HERE, "csrc", "include", "sparsecomm", "*.h")),
                )
                ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extensions()


def make_extension():
    # every binding file csrc/*.cpp (ops.cpp holds TORCH_LIBRARY; the others add their ops
    # with TORCH_LIBRARY_FRAGMENT so algorithm families can own their bindings)
    # (csrc/ops_cuda.cpp compiles to nothing unless SPARSECOMM_CUDA_KERNELS is defined)
    sources = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.cpp")))
    kwargs = dict(
        include_dirs=INCLUDE_DIRS,
        extra_link_args=LINK_FLAGS,
    )
    if want_cuda():
        ext = CUDAExtension(
            "sparsecomm._C",
            sources + CU_SOURCES,
            extra_compile_args={"cxx": CXX_FLAGS + ["-DSPARSECOMM_WITH_CUDA", "-DSPARSECOMM_CUDA_KERNELS"],
                                "nvcc": NVCC_FLAGS + ([] if os.environ.get("TORCH_CUDA_ARCH_LIST") else CUDA_ARCHS)},
            **kwargs)
    else:
        ext = CppExtension(
            "sparsecomm._C",
            sources,
            extra_compile_args={"cxx": CXX_FLAGS},
            **kwargs)
    ext._sc_c_sources = C_SOURCES
    return ext


def long_description():
    path = os.path.join(HERE, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return "sparsecomm: communication-efficient sparse allreduce for PyTorch."


setup(
    long_description=long_description(),
    long_description_content_type="text/markdown",
    ext_modules=[make_extension()],
    cmdclass={"build_ext": BuildExt},
)
