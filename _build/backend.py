"""In-tree PEP 517 build backend: setuptools.build_meta plus the target's torch.

Why this exists: sparsecomm's extension must be compiled against the very torch
it will run with (C++ ABI, TORCH_LIBRARY schema, libtorch symbols). Plain
``pip install .`` builds in an isolated environment that hides the target
environment's site-packages, so ``import torch`` in setup.py would fail; putting
``torch`` into ``[build-system] requires`` is worse: pip would download a fresh
(possibly different version, possibly multi-GB CUDA) torch into the build env
and the extension would be built against the wrong ABI.

pip runs this backend with the target environment's interpreter, so
``sys.prefix`` is the environment being installed into. We append that
environment's site-packages (sysconfig purelib/platlib for sys.prefix) to the
END of sys.path: the isolated build requirements (setuptools, wheel) still win,
and setup.py can import the torch that is already installed there. Nothing is
downloaded or installed. With ``--no-build-isolation`` the paths are already
on sys.path and this is a no-op.
"""
import sys
import sysconfig


def _add_target_site_packages():
    for key in ("purelib", "platlib"):
        path = sysconfig.get_path(key, vars={"base": sys.prefix, "platbase": sys.prefix})
        if path and path not in sys.path:
            sys.path.append(path)


_add_target_site_packages()

from setuptools import build_meta as _orig  # noqa: E402
from setuptools.build_meta import *  # noqa: E402,F401,F403

# Re-export the hooks explicitly so static readers see them.
get_requires_for_build_wheel = _orig.get_requires_for_build_wheel
get_requires_for_build_sdist = _orig.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _orig.prepare_metadata_for_build_wheel
build_wheel = _orig.build_wheel
build_sdist = _orig.build_sdist
get_requires_for_build_editable = _orig.get_requires_for_build_editable
prepare_metadata_for_build_editable = _orig.prepare_metadata_for_build_editable
build_editable = _orig.build_editable
