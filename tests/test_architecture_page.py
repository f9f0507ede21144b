"""docs/architecture.md's list of the core modules over ~450 lines, held against the code.

The page says why each core module longer than :data:`LIMIT` lines is one job; this test keeps
that list from going stale: every such module is on it, nothing shorter is, and each figure
``(~N)`` is within :data:`SLACK` of the module's length today. Tooling (``bench/``, ``launch/``,
``testing.py``) may be longer and is not listed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "sparsecomm"
TOOLING = ("bench", "launch", "testing.py")
LIMIT = 450
SLACK = 0.10
HEADING = "## Modules over ~450 lines"
_ENTRY = re.compile(r"`([\w/]+\.py)` \(~(\d+)\)")


def core_lengths(package: Path) -> dict[str, int]:
    """Lines of every core module, by its path under ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in TOOLING or "__pycache__" in rel.parts:
            continue
        out[rel.as_posix()] = len(path.read_text().splitlines())
    return out


def listed(page: str) -> dict[str, int]:
    """The ``path (~N)`` entries of the page's section on long modules."""
    start = page.index(HEADING)
    end = page.find("\n## ", start + len(HEADING))
    return {path: int(n) for path, n in _ENTRY.findall(page[start:end if end >= 0 else None])}


def stale_entries(page: str, lengths: dict[str, int]) -> list[str]:
    entries = listed(page)
    problems = [f"{path} ({n} lines) is over {LIMIT} and not on the page: say why it is one job, or cut it"
                for path, n in lengths.items() if n > LIMIT and path not in entries]
    for path, said in entries.items():
        if path not in lengths:
            problems.append(f"{path} is on the page but is no core module")
        elif lengths[path] <= LIMIT:
            problems.append(f"{path} is on the page but has {lengths[path]} lines, not over {LIMIT}: take it off")
        elif abs(said - lengths[path]) > SLACK * lengths[path]:
            problems.append(f"{path}: the page says ~{said}, it has {lengths[path]} lines")
    return problems


def test_long_modules_are_on_the_page_with_their_length():
    problems = stale_entries(PAGE.read_text(), core_lengths(PACKAGE))
    assert not problems, "docs/architecture.md, \"Modules over ~450 lines\":\n  " + "\n  ".join(problems)


def test_the_check_on_a_planted_page():
    page = f"# x\n\n{HEADING}\n\n- `a.py` (~500): why. `b/c.py` (~460) too.\n\n## Next\n`d.py` (~900)\n"
    assert listed(page) == {"a.py": 500, "b/c.py": 460}
    assert stale_entries(page, {"a.py": 520, "b/c.py": 470, "e.py": 10}) == []
    assert stale_entries(page, {"a.py": 600, "b/c.py": 300, "d.py": 900}) == [
        f"d.py (900 lines) is over {LIMIT} and not on the page: say why it is one job, or cut it",
        "a.py: the page says ~500, it has 600 lines",
        f"b/c.py is on the page but has 300 lines, not over {LIMIT}: take it off"]
