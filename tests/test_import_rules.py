"""The import rules of the sparsecomm package, read from its source with ``ast`` (nothing is imported).

Every import statement under ``sparsecomm/`` counts, at module level or inside a function,
except those in the body of an ``if TYPE_CHECKING:`` (they never run). Relative imports are
resolved against the importing module's package; ``from pkg import name`` imports the module
``pkg.name`` when ``pkg/name`` is a module of the package (a ``.py`` file, a package or a
compiled extension), else it imports ``pkg``.

Arrows of the import graph: importing ``a.b.c`` from a module *outside* package ``a.b`` gives
arrows to ``a.b`` (its ``__init__``, which Python runs first) and to ``a.b.c``; from a module
*inside* ``a.b`` only to ``a.b.c`` (``a.b`` is already initialising). The same holds for every
ancestor package of the imported module: an arrow to each one the importer is not inside.

The rules:

* (a) the library never imports the tooling: no arrow from a core module to a tooling
  module, where tooling is ``sparsecomm.bench`` (and everything under it),
  ``sparsecomm.launch`` and ``sparsecomm.testing``, and core is every other module;
* (b) no import cycle among sparsecomm's modules (a strongly connected part of the graph,
  reported as one cycle through it, as a chain of files and the lines that import);
* (c) a private module (a dotted-path part starting with ``_``, say ``p._m`` or
  ``p._m.x``) is imported only from inside the package that holds it, ``p`` (its modules,
  its subpackages and its own ``__init__``): ``sparsecomm/reduce/reducer.py`` importing
  ``sparsecomm.ops._torch_impl`` breaks it, ``sparsecomm/ops/_sketch.py`` importing it does not;
* (d) the tooling uses the library's public names only: a tooling module imports no private
  module of the core (``sparsecomm.bench.baselines`` importing ``sparsecomm._checkpoint`` breaks
  it), so the library may reshape its insides without breaking its own benchmarks;
* (e) the kernels have one door: the compiled extension ``sparsecomm._C`` is imported only
  from inside ``sparsecomm.ops`` (rule (c) alone allows any module of ``sparsecomm``, which
  holds ``_C``); everything else calls ``sparsecomm.ops``' public ops.
* (f) rule 1 of docs/architecture.md, arrows only downward: every core module belongs to a room
  (:data:`ROOMS`) and imports only the rooms its row of the page's table allows
  (:data:`MAY_IMPORT`, the table written again here as the test's reference).
"""
from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sparsecomm"
TOOLING = ("sparsecomm.bench", "sparsecomm.launch", "sparsecomm.testing")
KERNELS = "sparsecomm._C"
KERNEL_DOOR = "sparsecomm.ops"


@dataclass(frozen=True)
class Import:
    importer: str   # dotted module name
    line: int
    target: str     # the module the statement imports, resolved


def _module_names(root: Path, package: str) -> dict[str, Path | None]:
    """Dotted name -> source file (None for a compiled extension) of every module of ``package``."""
    names: dict[str, Path | None] = {}
    for path in sorted((root / package).rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(root)
        if path.suffix == ".py":
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join(parts)] = path
        elif path.suffix in (".so", ".pyd"):   # _C.cpython-311-x86_64-linux-gnu.so -> _C
            names[".".join(rel.parent.parts + (path.name.split(".")[0],))] = None
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST):
    """Every Import / ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


@functools.lru_cache(maxsize=None)   # the three rules read the same tree once
def collect_imports(root: Path, package: str) -> tuple[dict[str, Path | None], list[Import]]:
    modules = _module_names(root, package)
    imports: list[Import] = []
    for name, path in modules.items():
        if path is None:
            continue
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _statements(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = own_package.split(".")
                    if node.level - 1 >= len(base_parts):
                        raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top package")
                    base = ".".join(base_parts[:len(base_parts) - (node.level - 1)])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in dict.fromkeys(targets):
                if target == package or target.startswith(package + "."):
                    imports.append(Import(name, node.lineno, target))
    return modules, imports


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def arrows(imp: Import) -> list[str]:
    """The modules an import runs: each ancestor package the importer is not inside, then the target."""
    parts = imp.target.split(".")
    out = [".".join(parts[:i]) for i in range(1, len(parts))]
    out = [p for p in out if not _inside(imp.importer, p)]
    if imp.target != imp.importer and not _inside(imp.importer, imp.target):
        out.append(imp.target)
    return out


def graph(imports: list[Import]) -> dict[str, dict[str, int]]:
    """importer -> {imported module: first line that imports it}."""
    g: dict[str, dict[str, int]] = {}
    for imp in imports:
        for to in arrows(imp):
            lines = g.setdefault(imp.importer, {})
            lines[to] = min(lines.get(to, imp.line), imp.line)
    return g


def _file(modules: dict[str, Path | None], name: str, root: Path) -> str:
    path = modules.get(name)
    return str(path.relative_to(root)) if path is not None else name


def tooling_imports(root: Path, package: str, tooling: tuple[str, ...]) -> list[str]:
    modules, imports = collect_imports(root, package)
    is_tooling = lambda m: any(_inside(m, t) for t in tooling)  # noqa: E731
    return sorted({f"{_file(modules, imp.importer, root)}:{imp.line} imports {to} (tooling)"
                   for imp in imports if not is_tooling(imp.importer)
                   for to in arrows(imp) if is_tooling(to)})


def _components(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative) with a cycle: more than one module, or a self-arrow."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1 or node in g.get(node, {}):
                    found.append(sorted(part))
    return found


def _shortest_cycle(g: dict[str, dict[str, int]], members: list[str]) -> list[str]:
    """The shortest cycle through the first member, inside its component."""
    start, allowed = members[0], set(members)
    before = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(g.get(node, {})):
            if child == start:
                chain = [node]
                while before[chain[-1]] is not None:
                    chain.append(before[chain[-1]])
                return list(reversed(chain)) + [start]
            if child in allowed and child not in before:
                before[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")


def import_cycles(root: Path, package: str) -> list[str]:
    modules, imports = collect_imports(root, package)
    g = graph(imports)
    reports = []
    for members in _components(g):
        chain = _shortest_cycle(g, members)
        steps = " -> ".join(f"{_file(modules, a, root)}:{g[a][b]}" for a, b in zip(chain, chain[1:]))
        reports.append(f"cycle {steps} -> {_file(modules, chain[-1], root)}"
                       + (f" (its component also holds {', '.join(m for m in members if m not in chain)})"
                          if len(members) > len(chain) - 1 else ""))
    return sorted(reports)


def private_imports(root: Path, package: str) -> list[str]:
    modules, imports = collect_imports(root, package)
    out = set()
    for imp in imports:
        parts = imp.target.split(".")
        private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
        if private is None:
            continue
        owner = ".".join(parts[:private])
        if not _inside(imp.importer, owner):
            out.add(f"{_file(modules, imp.importer, root)}:{imp.line} imports {imp.target}, "
                    f"a private module of {owner}")
    return sorted(out)


def kernel_imports(root: Path, package: str, extension: str, door: str) -> list[str]:
    modules, imports = collect_imports(root, package)
    return sorted({f"{_file(modules, imp.importer, root)}:{imp.line} imports {extension}"
                   for imp in imports if imp.target == extension and not _inside(imp.importer, door)})


def tooling_private_imports(root: Path, package: str, tooling: tuple[str, ...]) -> list[str]:
    modules, imports = collect_imports(root, package)
    is_tooling = lambda m: any(_inside(m, t) for t in tooling)  # noqa: E731
    private = lambda m: any(p.startswith("_") and not p.startswith("__") for p in m.split("."))  # noqa: E731
    return sorted({f"{_file(modules, imp.importer, root)}:{imp.line} imports {imp.target}, a private module of the library"
                   for imp in imports if is_tooling(imp.importer) and not is_tooling(imp.target)
                   and private(imp.target)})


# -- the package's own source ----------------------------------------------------------------------
def test_core_does_not_import_tooling():
    found = tooling_imports(ROOT, PACKAGE, TOOLING)
    assert not found, ("the library imports benchmark / launch / test tooling (move what it needs into the "
                       "library, or the import into the tooling):\n  " + "\n  ".join(found))


def test_no_import_cycles():
    found = import_cycles(ROOT, PACKAGE)
    assert not found, ("import cycles among sparsecomm's modules (function-level imports count too; break each "
                       "by moving what both sides need into a module below them):\n  " + "\n  ".join(found))


def test_no_private_module_imported_across_packages():
    found = private_imports(ROOT, PACKAGE)
    assert not found, ("private modules imported from outside their package (import the package's public "
                       "names instead):\n  " + "\n  ".join(found))


def test_tooling_uses_public_names_only():
    found = tooling_private_imports(ROOT, PACKAGE, TOOLING)
    assert not found, ("benchmark / launch / test tooling imports a private module of the library (make what it "
                       "needs public, or keep it in the tooling):\n  " + "\n  ".join(found))


def test_kernels_reached_only_through_ops():
    found = kernel_imports(ROOT, PACKAGE, KERNELS, KERNEL_DOOR)
    assert not found, (f"{KERNELS} imported outside {KERNEL_DOOR} (call the public op in sparsecomm.ops, "
                       "adding one there if none exists):\n  " + "\n  ".join(found))


def unresolved_imports(root: Path, package: str) -> list[str]:
    modules, imports = collect_imports(root, package)
    return sorted({f"{_file(modules, imp.importer, root)}:{imp.line} imports {imp.target}, which is no module"
                   for imp in imports if imp.target not in modules})


def test_every_import_names_a_module():
    """A relative import left behind by a move (``from .comm import x`` in a subpackage) names a
    module that does not exist; it fails only when its line runs, so it is caught here."""
    found = unresolved_imports(ROOT, PACKAGE)
    assert not found, "imports of modules that do not exist:\n  " + "\n  ".join(found)


# -- the rules on a planted package, against what each file was written to break --------------------
PLANTED = {
    "pkg/__init__.py": "from . import core\nfrom ._version import v\n",
    "pkg/_version.py": "v = 1\n",
    "pkg/_ext.so": "",
    "pkg/core.py": ("from typing import TYPE_CHECKING\n"
                    "from .sub import thing\n"
                    "if TYPE_CHECKING:\n"
                    "    from .tools import helper\n"
                    "def f():\n"
                    "    from . import _ext\n"
                    "    from .sub import _hidden\n"
                    "    import pkg.tools.deep\n"),
    "pkg/sub/__init__.py": "from ._hidden import thing\nfrom .leaf import x\n",
    "pkg/sub/_hidden.py": "thing = 1\n",
    "pkg/sub/leaf.py": "def g():\n    from ..other import y\n",
    "pkg/other.py": "from .sub.leaf import x as y\nfrom .sub import leaf\n",
    "pkg/tools/__init__.py": "",
    "pkg/tools/deep.py": "from .. import core\nfrom .._version import v\n",
}


def _plant(tmp_path: Path) -> Path:
    for rel, text in PLANTED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_rules_on_a_planted_package(tmp_path):
    root = _plant(tmp_path)
    modules, imports = collect_imports(root, "pkg")
    assert modules["pkg._ext"] is None
    g = graph(imports)
    # core sees neither pkg (it is inside) nor tools.helper (TYPE_CHECKING); `import pkg.tools.deep`
    # runs pkg.tools' __init__ first; `from . import _ext` is the extension module
    assert g["pkg.core"] == {"pkg.sub": 2, "pkg._ext": 6, "pkg.sub._hidden": 7, "pkg.tools": 8, "pkg.tools.deep": 8}
    assert g["pkg.sub.leaf"] == {"pkg.other": 2}                    # not pkg.sub: leaf is inside it
    assert g["pkg.other"] == {"pkg.sub": 1, "pkg.sub.leaf": 1}
    assert g["pkg.tools.deep"] == {"pkg.core": 1, "pkg._version": 2}
    assert tooling_imports(root, "pkg", ("pkg.tools",)) == [
        "pkg/core.py:8 imports pkg.tools (tooling)", "pkg/core.py:8 imports pkg.tools.deep (tooling)"]
    # the shortest cycle through the component's first module; pkg.sub is in the component too
    assert import_cycles(root, "pkg") == [
        "cycle pkg/core.py:8 -> pkg/tools/deep.py:1 -> pkg/core.py",
        "cycle pkg/other.py:1 -> pkg/sub/leaf.py:2 -> pkg/other.py (its component also holds pkg.sub)"]
    # pkg.sub._hidden from pkg.core is across packages; pkg._ext and pkg._version from inside pkg are not
    assert private_imports(root, "pkg") == ["pkg/core.py:7 imports pkg.sub._hidden, a private module of pkg.sub"]
    # the extension's one door is pkg.sub: core's function-level import of it is the one breach
    assert kernel_imports(root, "pkg", "pkg._ext", "pkg.sub") == ["pkg/core.py:6 imports pkg._ext"]
    assert unresolved_imports(root, "pkg") == []
    # pkg.tools.deep reaches pkg._version, a private module of the core
    assert tooling_private_imports(root, "pkg", ("pkg.tools",)) == [
        "pkg/tools/deep.py:2 imports pkg._version, a private module of the library"]


# -- rule 1 of docs/architecture.md: each core room imports only the rooms its table row allows ------
#: core room -> the directory (package) that holds it; the root package holds no room but the face
#: (its __init__), the leaves and the aliases of moved modules (:data:`ALIASES`)
ROOM_DIRS = {
    "integrations": "sparsecomm.integrations",
    "hooks": "sparsecomm.hooks",
    "reduce": "sparsecomm.reduce",
    "tune": "sparsecomm.tune",
    "algorithms": "sparsecomm.algorithms",
    "traffic": "sparsecomm.traffic",
    "comm": "sparsecomm.comm",
    "formats": "sparsecomm.formats",
    "ops": "sparsecomm.ops",
}
#: modules that moved, kept importable at their old path as the same module object (pickled states,
#: ``import sparsecomm.hook``): old dotted name -> the module it is
ALIASES = {
    "sparsecomm.hook": "sparsecomm.hooks.ddp",
    "sparsecomm.fsdp": "sparsecomm.hooks.fsdp",
    "sparsecomm.bucket_worker": "sparsecomm.hooks.bucket_worker",
    "sparsecomm.reducer": "sparsecomm.reduce.reducer",
    "sparsecomm.density": "sparsecomm.reduce.density",
    "sparsecomm.costmodel": "sparsecomm.tune.costmodel",
    "sparsecomm.algorithms.auto": "sparsecomm.tune.auto",
}
LEAVES = ("sparsecomm.errors", "sparsecomm._version", "sparsecomm.options")
#: core module (longest dotted prefix wins; the root package names only its own __init__) -> its room;
#: an alias belongs to the room of the module it is
ROOMS = {
    "sparsecomm": "face",
    **{package: room for room, package in ROOM_DIRS.items()},
    "sparsecomm._C": "kernels",
    **{leaf: "leaves" for leaf in LEAVES},
    **{alias: next(room for room, package in ROOM_DIRS.items() if _inside(target, package))
       for alias, target in ALIASES.items()},
}
#: room -> the other rooms it may import (every room may import its own modules and the leaves)
MAY_IMPORT = {
    # above the face: the package's public names only (importing ``sparsecomm`` itself is no arrow);
    # no room lists it, so the core never imports an integration
    "integrations": set(),
    "face": {"hooks", "reduce", "tune", "algorithms", "comm", "formats", "ops"},
    "hooks": {"reduce", "algorithms", "comm"},
    "reduce": {"tune", "algorithms", "comm", "formats", "ops"},
    "tune": {"algorithms", "traffic", "comm"},
    "algorithms": {"traffic", "comm", "formats", "ops"},
    "traffic": {"formats"},
    "comm": {"formats"},
    "formats": {"ops"},
    "ops": {"kernels"},
    "kernels": set(),
    "leaves": set(),
}


def test_rooms_are_directories():
    """Every room but the face, the leaves and the compiled kernels is a package of its own, and
    the root package holds nothing else: the face, the leaves, the aliases, the tooling."""
    for room, package in ROOM_DIRS.items():
        path = ROOT / Path(*package.split("."))
        assert (path / "__init__.py").is_file(), f"room {room!r} must be the directory {path}"
    modules, _ = collect_imports(ROOT, PACKAGE)
    top = sorted(m for m in modules if m.count(".") == 1 and modules[m] is not None
                 and modules[m].name != "__init__.py")
    allowed = set(LEAVES) | set(ALIASES) | {t for t in TOOLING if modules.get(t) is not None
                                            and modules[t].name != "__init__.py"}
    assert [m for m in top if m not in allowed] == [], (
        "modules at the package's root that are no leaf, alias or tooling: put each in its room's directory")


def test_aliases_are_the_modules_they_name():
    """An alias file only makes its old name the same module object as the new one."""
    import importlib

    for alias, target in ALIASES.items():
        path = ROOT / Path(*alias.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
        body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
        assert len(body) == 3 and isinstance(body[-1], ast.Assign), f"{path}: an alias holds nothing but the alias"
        assert importlib.import_module(alias) is importlib.import_module(target), alias


def room_of(module: str, rooms: dict[str, str]) -> str | None:
    root = min(rooms, key=len)
    best = max((p for p in rooms if p != root and _inside(module, p)), key=len, default=None)
    if best is None:
        return rooms[root] if module == root else None
    return rooms[best]


def room_breaches(root: Path, package: str, rooms: dict[str, str], may: dict[str, set[str]]) -> list[str]:
    modules, imports = collect_imports(root, package)
    out = set()
    for imp in imports:
        src = room_of(imp.importer, rooms)
        if src is None:
            continue  # tooling (no room): rules (a) and (d) cover it
        for to in arrows(imp):
            dst = room_of(to, rooms)
            if dst is None or dst in (src, "leaves") or to == package:
                continue
            if dst not in may[src]:
                out.add(f"{_file(modules, imp.importer, root)}:{imp.line} ({src}) imports {to} ({dst})")
    return sorted(out)


def test_every_core_module_has_a_room():
    modules, _ = collect_imports(ROOT, PACKAGE)
    tooling = lambda m: any(_inside(m, t) for t in TOOLING)  # noqa: E731
    homeless = sorted(m for m in modules if not tooling(m) and room_of(m, ROOMS) is None)
    assert not homeless, f"modules in no room of docs/architecture.md (add them to ROOMS and the page): {homeless}"


def test_each_room_imports_only_what_its_row_allows():
    found = room_breaches(ROOT, PACKAGE, ROOMS, MAY_IMPORT)
    assert not found, ("imports against the rooms table of docs/architecture.md (move the code to the room that "
                       "may import it, or change the table here and on the page together):\n  " + "\n  ".join(found))


def test_room_rule_on_a_planted_package(tmp_path):
    root = _plant(tmp_path)
    rooms = {"pkg": "face", "pkg.core": "upper", "pkg.sub": "lower", "pkg.other": "lower",
             "pkg._version": "leaves", "pkg._ext": "lower"}
    may = {"face": {"upper", "lower"}, "upper": {"lower"}, "lower": set(), "leaves": set()}
    # core -> sub, _ext: allowed; tools is in no room (tooling: rules (a), (d)); sub.leaf <-> other: one room
    assert room_breaches(root, "pkg", rooms, may) == []
    may["upper"] = set()
    assert room_breaches(root, "pkg", rooms, may) == [
        "pkg/core.py:2 (upper) imports pkg.sub (lower)", "pkg/core.py:6 (upper) imports pkg._ext (lower)",
        "pkg/core.py:7 (upper) imports pkg.sub (lower)", "pkg/core.py:7 (upper) imports pkg.sub._hidden (lower)"]
