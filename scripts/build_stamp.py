"""Whether the extension needs building again, for scripts/setup.sh (standard library only).

    python scripts/build_stamp.py check STAMP     exit 0 when this environment's editable install
                                                  is current (printing its versions), else print
                                                  why not and exit 1
    python scripts/build_stamp.py write STAMP     record the build just made
    pip install -v ... | python scripts/build_stamp.py progress LOG
                                                  one progress line per compiled source; pip's
                                                  whole output goes to LOG

The install is editable: this environment imports ``sparsecomm`` from the checkout itself (a
finder that maps the package to ``<checkout>/sparsecomm``), and the extension is built in place
as ``sparsecomm/_C<EXT_SUFFIX>``. Editing a ``.py`` file under ``sparsecomm/`` (or adding one)
therefore needs no reinstall; only what the compiled extension is made from does. The stamp
records that: the hash of every file the build reads (:data:`INPUTS`), the torch and Python it
was built against, the variables that change the build (:data:`BUILD_ENV`), the checkout's path
and the extension file it produced. ``check`` compares them all and then loads the extension
with torch, so a missing, replaced or unloadable build is rebuilt too.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import re
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = 1

#: what setup.py compiles or reads to compile (glob patterns relative to the checkout)
INPUTS = ["setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "_build/*", "csrc/*", "csrc/cpu/*",
          "csrc/cuda/*", "csrc/include/**/*"]
# Not inputs: csrc/tests and csrc/fuzz (standalone C builds of `make ctest` / `make fuzz`), and
# README.md, which setup.py reads only as the package's long description (metadata, not code).

#: variables that change what setup.py builds (setup.py, torch's BuildExtension, the compilers)
BUILD_ENV = ["SPARSECOMM_CUDA_KERNELS", "SPARSECOMM_NO_CUDA", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CC", "CXX",
             "CFLAGS", "CXXFLAGS", "LDFLAGS"]


def input_files(root: str = ROOT) -> list[str]:
    """The build's input files, relative to ``root``, sorted."""
    found = set()
    for pattern in INPUTS:
        for path in glob.glob(os.path.join(root, pattern), recursive=True):
            if os.path.isfile(path) and not path.endswith(".pyc"):
                found.add(os.path.relpath(path, root).replace(os.sep, "/"))
    return sorted(found)


def extension_path(root: str = ROOT) -> str:
    return os.path.join(root, "sparsecomm", "_C" + sysconfig.get_config_var("EXT_SUFFIX"))


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _file_id(path: str) -> dict | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def record(root: str = ROOT, torch_version: str | None = None) -> dict:
    """What a build made now from this checkout would be made of."""
    if torch_version is None:
        import torch
        torch_version = torch.__version__
    return {
        "format": FORMAT,
        "checkout": os.path.abspath(root),
        "python": f"{sys.implementation.name} {sys.version.split()[0]} {sysconfig.get_config_var('EXT_SUFFIX')}",
        "torch": torch_version,
        "env": {k: os.environ[k] for k in BUILD_ENV if k in os.environ},
        "inputs": {rel: _sha256(os.path.join(root, rel)) for rel in input_files(root)},
        "extension": _file_id(extension_path(root)),
    }


def _changed_files(old: dict, new: dict) -> list[str]:
    changed = [f"{p} changed" for p in sorted(old.keys() & new.keys()) if old[p] != new[p]]
    changed += [f"{p} added" for p in sorted(new.keys() - old.keys())]
    changed += [f"{p} removed" for p in sorted(old.keys() - new.keys())]
    if len(changed) > 3:
        changed = changed[:3] + [f"{len(changed) - 3} more files"]
    return changed


def _imported_from() -> str | None:
    """Where this environment imports ``sparsecomm`` from (its package folder), None if nowhere.

    Run from scripts/: sys.path[0] is this folder, not the checkout, so the answer is the
    environment's own (the editable install's finder), never the current directory's."""
    try:
        spec = importlib.util.find_spec("sparsecomm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.abspath(spec.origin))


def stale_reasons(stamp_path: str, root: str = ROOT, load=True) -> list[str]:
    """Why this environment's build of ``root`` must be made again; empty when it is current.

    The cheap comparisons come first; torch is imported (and the extension loaded, when
    ``load``) only when they all pass."""
    try:
        with open(stamp_path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return ["no build recorded in this environment"]
    if old.get("format") != FORMAT:
        return ["the build record is of an older setup script"]
    new = record(root, torch_version=old.get("torch"))  # torch compared below, after the cheap checks
    reasons = []
    if old.get("checkout") != new["checkout"]:
        reasons.append(f"the checkout was {old.get('checkout')}")
    if old.get("python") != new["python"]:
        reasons.append(f"Python {old.get('python')} -> {new['python']}")
    for key in sorted(set(old.get("env", {})) | set(new["env"])):
        before, after = old.get("env", {}).get(key), new["env"].get(key)
        if before != after:
            reasons.append(f"{key}={before if before is not None else '(unset)'} -> "
                           f"{after if after is not None else '(unset)'}")
    reasons += _changed_files(old.get("inputs", {}), new["inputs"])
    ext = os.path.relpath(extension_path(root), root)
    if new["extension"] is None:
        reasons.append(f"{ext} is missing")
    elif old.get("extension") != new["extension"]:
        reasons.append(f"{ext} was replaced since")
    package = os.path.join(os.path.abspath(root), "sparsecomm")
    where = _imported_from()
    if where is None:
        reasons.append("sparsecomm is not installed in this environment")
    elif os.path.realpath(where) != os.path.realpath(package):
        reasons.append(f"this environment imports sparsecomm from {where}")
    if reasons:
        return reasons
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any failure to import torch means: install again
        return [f"torch does not import: {exc}"]
    if torch.__version__ != old.get("torch"):
        return [f"torch {old.get('torch')} -> {torch.__version__}"]
    if load:
        try:
            spec = importlib.util.spec_from_file_location("sparsecomm._C", extension_path(root))
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as exc:  # noqa: BLE001 - an undefined symbol, a wrong ABI, ...
            return [f"{ext} does not load: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    return []


def write(stamp_path: str, root: str = ROOT) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(stamp_path)), exist_ok=True)
    tmp = f"{stamp_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record(root), f, indent=1, sort_keys=True)
    os.replace(tmp, stamp_path)


def expected_sources(root: str = ROOT) -> int:
    """How many files setup.py compiles: the C kernels, the binding files (and the CUDA
    kernels when asked for)."""
    names = [p for p in input_files(root) if re.fullmatch(r"csrc/(cpu/[^/]+\.c|[^/]+\.cpp)", p)]
    if os.environ.get("SPARSECOMM_CUDA_KERNELS") == "1":
        names += [p for p in input_files(root) if p.startswith("csrc/cuda/") and p.endswith(".cu")]
    return len(names)


# a compiler's command line as setuptools logs it (the C kernels, one at a time) or a ninja
# step of torch's BuildExtension ("[3/8] c++ ... -c /path/csrc/ops.cpp -o ...")
_COMPILE = re.compile(r"\s-c\s+(\S+\.(?:c|cc|cpp|cu))(?:\s|$)")


def progress(log_path: str, lines=sys.stdin, out=sys.stdout, total: int | None = None) -> None:
    """Copy pip's output to ``log_path`` and print a line per compiled source (the C kernels as
    each starts, the C++ bindings as ninja finishes each): in place on a terminal, one line each
    otherwise."""
    total = total or expected_sources()
    tty = out.isatty()
    start, seen = time.monotonic(), []
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as log:
        for line in lines:
            log.write(line)
            log.flush()
            m = _COMPILE.search(line)
            if not m:
                continue
            source = os.path.relpath(m.group(1), ROOT) if os.path.isabs(m.group(1)) else m.group(1)
            if source in seen:
                continue
            seen.append(source)
            elapsed = int(time.monotonic() - start)
            text = f"setup:   [{len(seen)}/{max(total, len(seen))}] {source}, {elapsed // 60}:{elapsed % 60:02d} in"
            out.write(f"\r{text:<78}" if tty else text + "\n")
            out.flush()
    if tty and seen:
        out.write("\n")
    out.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("check", "write", "progress"):
        print(__doc__, file=sys.stderr)
        return 2
    command, path = argv
    if command == "write":
        write(path)
        return 0
    if command == "progress":
        progress(path)
        return 0
    reasons = stale_reasons(path)
    if reasons:
        print("; ".join(reasons))
        return 1
    import importlib.metadata

    import torch  # imported already by stale_reasons
    print(f"sparsecomm {importlib.metadata.version('sparsecomm')} with torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
