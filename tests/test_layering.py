"""The layers of the wire formats, the op layer and the Comm package, read from the sources:
formats/ reaches kernels only through the public names of sparsecomm.ops, ops/ never imports
formats/, and comm/collectives.py never imports comm/base.py (base imports it). Every import
counts, wherever it is written (module level, inside a function, under TYPE_CHECKING)."""
from __future__ import annotations

import ast
import os

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sparsecomm")


def _modules(sub: str) -> list[str]:
    folder = os.path.join(PKG, sub)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))


def _imports(path: str) -> list[tuple[str, str]]:
    """(absolute module, imported name or "") for every import statement of the file."""
    rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].split(os.sep)
    package = rel[:-1]  # the package the file is in (an __init__ is in its own)
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [(module, a.name) for a in node.names]
    return out


def _kernel_uses(path: str) -> list[str]:
    """Places where the file reaches a kernel without the op layer's public names."""
    text = open(path).read()
    found = ["torch.ops.sparsecomm"] if "torch.ops.sparsecomm" in text else []
    for module, name in _imports(path):
        target = f"{module}.{name}" if name else module
        private = [part for part in target.split(".")[1:] if part.startswith("_") and part != "__future__"]
        if target.startswith("sparsecomm.") and not target.startswith("sparsecomm.formats.") and private:
            found.append(target)
    return found


@pytest.mark.parametrize("path", _modules("formats"), ids=os.path.basename)
def test_formats_reach_kernels_only_through_the_public_op_layer(path):
    assert _kernel_uses(path) == []


@pytest.mark.parametrize("path", _modules("ops"), ids=os.path.basename)
def test_ops_never_import_formats(path):
    assert [m for m, _ in _imports(path) if m.startswith("sparsecomm.formats")] == []


def test_collectives_never_import_base():
    imported = [(m, n) for m, n in _imports(os.path.join(PKG, "comm", "collectives.py"))
                if m == "sparsecomm.comm.base" or (m == "sparsecomm.comm" and n == "base")]
    assert imported == []


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """The checks above would pass vacuously if the reader missed imports: it must see a
    relative one inside a function and one under TYPE_CHECKING."""
    folder = tmp_path / "sparsecomm" / "formats"
    folder.mkdir(parents=True)
    probe = folder / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..comm.base import Comm\n"
                     "def f():\n    from ..ops import _wire\n")
    global PKG
    saved, PKG = PKG, str(tmp_path / "sparsecomm")
    try:
        assert ("sparsecomm.comm.base", "Comm") in _imports(str(probe))
        assert _kernel_uses(str(probe)) == ["sparsecomm.ops._wire"]
    finally:
        PKG = saved
