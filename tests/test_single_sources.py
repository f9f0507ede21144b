"""Facts written once per language stay equal across the languages.

The wire prefix, the text a wire/format error from received bytes begins with (the Python face
turns a ValueError that starts with it into WireFormatError), has one source on each side of
the C/Python boundary: ``kWirePrefix`` in ``csrc/checks.h`` for the bindings and
``WIRE_PREFIX`` in ``sparsecomm/ops/_errors.py`` for everything in Python. C++ cannot import
the Python constant, so this test reads the header as text (nothing is built or imported from
C) and fails when the two differ, or when a second copy appears on either side.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sparsecomm.ops._errors import WIRE_PREFIX

ROOT = Path(__file__).resolve().parent.parent
CHECKS_H = ROOT / "csrc" / "checks.h"
_C_PREFIX = re.compile(r'constexpr\s+const\s+char\s*\*\s*kWirePrefix\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*;')


def _c_string(body: str) -> str:
    """The value of a C string literal's body (the text between the quotes)."""
    return body.encode("latin-1").decode("unicode_escape") if "\\" in body else body


def test_wire_prefix_c_equals_python():
    found = _C_PREFIX.findall(CHECKS_H.read_text())
    assert len(found) == 1, f"expected one kWirePrefix definition in {CHECKS_H}, found {len(found)}"
    assert _c_string(found[0]) == WIRE_PREFIX, (
        f"csrc/checks.h kWirePrefix = {_c_string(found[0])!r} but sparsecomm/ops/_errors.py "
        f"WIRE_PREFIX = {WIRE_PREFIX!r}: a malformed message raised by one side would not be "
        "recognised as a WireFormatError by the other")


def test_wire_prefix_written_once_per_language():
    py_copies = []
    for path in sorted((ROOT / "sparsecomm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and WIRE_PREFIX in node.value:
                py_copies.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert py_copies == ["sparsecomm/ops/_errors.py:" + str(_line_of_python_source())], (
        f"the wire prefix is written in {py_copies}: import WIRE_PREFIX from sparsecomm.ops._errors instead")
    c_copies = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "csrc").rglob("*"))
                if p.suffix in (".h", ".c", ".cpp", ".cu", ".cuh") and f'"{WIRE_PREFIX}' in p.read_text()]
    assert c_copies == ["csrc/checks.h"], (
        f"the wire prefix is written in {c_copies}: use kWirePrefix of csrc/checks.h instead")


def _line_of_python_source() -> int:
    tree = ast.parse((ROOT / "sparsecomm" / "ops" / "_errors.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "WIRE_PREFIX" for t in node.targets):
            return node.lineno
    raise AssertionError("sparsecomm/ops/_errors.py defines no WIRE_PREFIX")


# -- the non-finite bits: the kernel's SC_NONFINITE_* and sparsecomm.ops.NONFINITE_* ----------------
KERNELS_H = ROOT / "csrc" / "include" / "sparsecomm" / "kernels.h"
_C_NONFINITE = re.compile(r"#define\s+SC_NONFINITE_(NAN|POS_INF|NEG_INF)\s+(\d+)")


def test_nonfinite_bits_c_equals_python():
    import sparsecomm.ops as ops

    bits = {name: int(value) for name, value in _C_NONFINITE.findall(KERNELS_H.read_text())}
    assert bits == {"NAN": ops.NONFINITE_NAN, "POS_INF": ops.NONFINITE_POS_INF, "NEG_INF": ops.NONFINITE_NEG_INF}, (
        f"{KERNELS_H.relative_to(ROOT)} defines the non-finite bits {bits}, sparsecomm.ops "
        f"{(ops.NONFINITE_NAN, ops.NONFINITE_POS_INF, ops.NONFINITE_NEG_INF)}")


def test_nonfinite_bits_written_once_in_python():
    """No module but ops/_coo.py names a non-finite bit of its own (``_NAN = 1``, ``NAN, INF = 1, 2``)."""
    copies = []
    for path in sorted((ROOT / "sparsecomm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Assign):
                continue
            names = [t.id for target in node.targets
                     for t in (target.elts if isinstance(target, ast.Tuple) else [target]) if isinstance(t, ast.Name)]
            if any(re.fullmatch(r"_?(NONFINITE_)?(NAN|POS_INF|NEG_INF)", name.upper()) for name in names):
                copies.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(copies) == 1 and copies[0].startswith("sparsecomm/ops/_coo.py:"), (
        f"non-finite bits are defined in {copies}: use sparsecomm.ops.NONFINITE_NAN / _POS_INF / _NEG_INF")


# -- the hierarchies: the cost model's layouts, and the reducer's option built on them ---------------
def test_hierarchies_are_the_layouts_and_auto():
    """``hierarchy`` takes what the cost model can time, plus "auto"; no module lists them again."""
    from sparsecomm.reduce import HIERARCHIES
    from sparsecomm.tune import LAYOUTS

    assert HIERARCHIES == (*LAYOUTS, "auto")
    lists = []
    for path in sorted((ROOT / "sparsecomm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Tuple, ast.List)):
                words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if {"flat", "node"} <= words:
                    lists.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert lists == ["sparsecomm/tune/costmodel.py:" + str(_line_of("sparsecomm/tune/costmodel.py", "LAYOUTS = "))], (
        f"the hierarchies are listed in {lists}: use sparsecomm.tune.LAYOUTS or sparsecomm.reduce.HIERARCHIES")


def _line_of(rel: str, start: str) -> int:
    lines = (ROOT / rel).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(start))
