"""The extension is built and registered, and the build backend finds torch."""
import importlib.util
import os
import subprocess
import sys
import sysconfig

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_extension_registers_ops():
    import sparsecomm._C  # noqa: F401
    import sparsecomm.ops as ops
    for name in ["topk", "block_topk", "merge_add", "merge_add_many", "scatter_add_", "scatter_set_", "gather",
                 "nonfinite_flags"]:
        assert hasattr(torch.ops.sparsecomm, name), name
        assert name in ops.__all__


def test_backend_appends_target_site_packages():
    # _build/backend.py must append (not prepend) this environment's site-packages
    code = (
        "import sys, sysconfig; sys.path = [p for p in sys.path if 'site-packages' not in p]; "
        f"sys.path.insert(0, {os.path.join(ROOT, '_build')!r}); import backend; "
        "p = sysconfig.get_path('purelib', vars={'base': sys.prefix, 'platbase': sys.prefix}); "
        "assert sys.path[-1] == p or p in sys.path[-2:], sys.path; import torch; print('ok')"
    )
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools not installed")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_setup_fails_clearly_without_torch(tmp_path):
    # run setup.py with torch made unimportable
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "setup.py"), "--version"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode != 0
    assert "install torch first, e.g. pip install torch==2.13.0" in r.stderr


def test_cuda_kernels_are_opt_in_and_fail_clearly_when_impossible():
    import sparsecomm.ops as ops
    assert ops.CUDA_KERNELS is False  # a default build registers the torch implementations for CUDA
    if torch.version.cuda:
        pytest.skip("this torch has CUDA: asking for the kernels would build them")
    env = dict(os.environ, SPARSECOMM_CUDA_KERNELS="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "setup.py"), "--version"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode != 0
    assert "SPARSECOMM_CUDA_KERNELS=1 but the CUDA kernels cannot be built: missing a torch built with CUDA" in r.stderr
