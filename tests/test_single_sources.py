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
