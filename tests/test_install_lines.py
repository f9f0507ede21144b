"""Install lines work where they are written.

sparsecomm is installed from a checkout (it is on no package index), so no page, message or
example may tell anyone to install it by name with an extra; the extras a checkout is installed
with (``pip install '.[lightning]'``) exist in pyproject.toml, and the framework requirements the
ImportErrors and pages quote (``pip install 'lightning>=2.2,<3'``) are pyproject's own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
#: the requirement of every extra's package, by its name ({"lightning": "lightning>=2.2,<3", ...})
SPECS = {re.match(r"[\w.-]+", spec).group(0): spec for specs in EXTRAS.values() for spec in specs}
INDEX_NAME = re.compile(r"sparsecomm\s*\[")  # the name of an unpublished package, with an extra
CHECKOUT_EXTRA = re.compile(r"""['"]\.\[([\w,-]+)\]['"]""")
# (not the regular expressions of tests that match such a line: no backslash)
QUOTED_SPEC = re.compile(r"'((%s)\s*[<>=!~][^'\\]*)'" % "|".join(map(re.escape, SPECS)))


def texts():
    """Every page, message, example and script a reader may copy an install line from."""
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]  # not CHANGELOG.md: it tells what was
    for folder in ("sparsecomm", "examples", "scripts", "benchmarks", "tests"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh", ".md")]
    for path in sorted(paths):
        if path.is_file() and path != Path(__file__).resolve():
            yield path.relative_to(ROOT).as_posix(), path.read_text(errors="replace")


def test_nothing_installs_sparsecomm_by_name_from_an_index():
    found = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for rel, text in texts()
             for m in INDEX_NAME.finditer(text)]
    assert not found, "say pip install '.[extra]' (from a checkout) or the framework's own requirement: " + \
        ", ".join(found)


def test_every_extra_a_checkout_is_installed_with_exists():
    named = {(rel, extra) for rel, text in texts() for m in CHECKOUT_EXTRA.finditer(text)
             for extra in m.group(1).split(",")}
    assert named, "no page names an extra any more: this test is stale"
    assert [f"{rel}: .[{extra}]" for rel, extra in sorted(named) if extra not in EXTRAS] == []


def test_quoted_framework_requirements_are_the_extras():
    quoted = [(rel, m.group(1), m.group(2)) for rel, text in texts() for m in QUOTED_SPEC.finditer(text)]
    assert {name for _, _, name in quoted} >= {"lightning", "accelerate", "mpi4py"}
    assert [f"{rel}: {spec} (pyproject: {SPECS[name]})" for rel, spec, name in quoted if spec != SPECS[name]] == []


def test_import_errors_say_what_to_install_in_both_forms(monkeypatch):
    import importlib
    import sys

    for module, framework, extra in [("sparsecomm.integrations.lightning", "lightning", "lightning"),
                                     ("sparsecomm.integrations.accelerate", "accelerate", "accelerate")]:
        # what an absent package looks like to import (its modules imported by other tests too)
        for name in [framework, "pytorch_lightning", *sys.modules]:
            if name.split(".")[0] in (framework, "pytorch_lightning"):
                monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, module, raising=False)
        with pytest.raises(ImportError) as info:
            importlib.import_module(module)
        assert f"pip install '{SPECS[framework]}'" in str(info.value)
        assert f"pip install '.[{extra}]'" in str(info.value)
