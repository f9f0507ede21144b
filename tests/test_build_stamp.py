"""scripts/build_stamp.py: `make setup` compiles the extension again only when it must.

Each case builds a small checkout in a temporary folder (setup.py, csrc/, _build/, a stand-in
extension file), records it as setup.sh does after a build, changes one thing and asks whether
the build is stale; the real extension is loaded in a subprocess only.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("build_stamp", os.path.join(ROOT, "scripts", "build_stamp.py"))
build_stamp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_stamp)

FILES = {
    "setup.py": "setup()\n",
    "pyproject.toml": "[project]\nname = 'sparsecomm'\n",
    "README.md": "# sparsecomm\n",
    "_build/backend.py": "# backend\n",
    "csrc/ops.cpp": "// binding\n",
    "csrc/checks.h": "// checks\n",
    "csrc/cpu/topk.c": "int topk;\n",
    "csrc/cpu/common.h": "// common\n",
    "csrc/include/sparsecomm/kernels.h": "// abi\n",
    "csrc/tests/test_topk.c": "int main(void) { return 0; }\n",
    "csrc/fuzz/corpus/topk/seed0": "seed\n",
    "sparsecomm/__init__.py": "",
    "sparsecomm/hook.py": "x = 1\n",
    "tests/test_x.py": "",
}


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout recorded as built: (root, stamp path)."""
    root = tmp_path / "checkout"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    with open(build_stamp.extension_path(str(root)), "wb") as f:
        f.write(b"\x7fELF stand-in")
    # this environment imports sparsecomm from the temporary checkout (the editable install's finder)
    monkeypatch.setattr(build_stamp, "_imported_from", lambda: str(root / "sparsecomm"))
    for key in build_stamp.BUILD_ENV:
        monkeypatch.delenv(key, raising=False)
    stamp = tmp_path / "venv" / ".sparsecomm-build.json"
    build_stamp.write(str(stamp), str(root))
    return root, str(stamp)


def stale(checkout) -> list[str]:
    root, stamp = checkout
    return build_stamp.stale_reasons(stamp, str(root), load=False)


def test_the_inputs_are_what_setup_py_reads():
    inputs = build_stamp.input_files(ROOT)
    compiled = [p for p in inputs if p.endswith((".c", ".cpp"))]
    assert compiled and all(p.startswith("csrc/") for p in compiled)
    on_disk = {os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
               for d, _, files in os.walk(os.path.join(ROOT, "csrc")) for f in files}
    # every source and header of the extension; not the standalone C tests and fuzzers
    assert set(inputs) >= {p for p in on_disk if not p.startswith(("csrc/tests/", "csrc/fuzz/"))}
    assert not [p for p in inputs if p.startswith(("csrc/tests/", "csrc/fuzz/"))]
    assert {"setup.py", "pyproject.toml", "_build/backend.py"} <= set(inputs)
    assert build_stamp.expected_sources(ROOT) == len(compiled) - sum(p.endswith(".cu") for p in compiled)


def test_a_recorded_build_is_current(checkout):
    assert stale(checkout) == []


def test_no_record_means_build(tmp_path):
    assert build_stamp.stale_reasons(str(tmp_path / "none.json"), ROOT, load=False) == [
        "no build recorded in this environment"]


@pytest.mark.parametrize("rel", ["sparsecomm/hook.py", "sparsecomm/new_module.py", "README.md", "tests/test_x.py",
                                 "csrc/tests/test_topk.c", "csrc/fuzz/corpus/topk/seed1"])
def test_python_docs_and_c_test_edits_need_no_build(checkout, rel):
    # the editable install imports sparsecomm/*.py from the checkout itself
    path = checkout[0] / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# edited\n")
    assert stale(checkout) == []


@pytest.mark.parametrize("rel", ["csrc/cpu/topk.c", "csrc/cpu/common.h", "csrc/ops.cpp", "csrc/checks.h",
                                 "csrc/include/sparsecomm/kernels.h", "setup.py", "pyproject.toml",
                                 "_build/backend.py"])
def test_an_edited_input_means_build(checkout, rel):
    with open(checkout[0] / rel, "a") as f:
        f.write("// edited\n")
    assert stale(checkout) == [f"{rel} changed"]


def test_added_and_removed_inputs_are_named(checkout):
    root = checkout[0]
    (root / "csrc" / "cpu" / "new.c").write_text("int x;\n")
    (root / "csrc" / "cpu" / "common.h").unlink()
    assert stale(checkout) == ["csrc/cpu/new.c added", "csrc/cpu/common.h removed"]


def test_many_changes_are_summed_up(checkout):
    for name in "abcde":
        (checkout[0] / "csrc" / "cpu" / f"{name}.c").write_text("int x;\n")
    assert stale(checkout) == ["csrc/cpu/a.c added", "csrc/cpu/b.c added", "csrc/cpu/c.c added", "2 more files"]


def test_a_missing_or_replaced_extension_means_build(checkout):
    root = checkout[0]
    ext = os.path.relpath(build_stamp.extension_path(str(root)), root)
    with open(root / ext, "ab") as f:
        f.write(b"rebuilt by hand")
    assert stale(checkout) == [f"{ext} was replaced since"]
    os.remove(root / ext)
    assert stale(checkout) == [f"{ext} is missing"]


def test_another_torch_means_build(checkout):
    root, stamp = checkout
    with open(stamp) as f:
        record = json.load(f)
    record["torch"] = "2.1.0"
    with open(stamp, "w") as f:
        json.dump(record, f)
    assert stale(checkout) == [f"torch 2.1.0 -> {torch.__version__}"]


def test_a_build_variable_means_build(checkout, monkeypatch):
    monkeypatch.setenv("SPARSECOMM_CUDA_KERNELS", "1")
    assert stale(checkout) == ["SPARSECOMM_CUDA_KERNELS=(unset) -> 1"]


def test_an_environment_importing_another_sparsecomm_means_build(checkout, monkeypatch):
    monkeypatch.setattr(build_stamp, "_imported_from", lambda: "/elsewhere/sparsecomm")
    assert stale(checkout) == ["this environment imports sparsecomm from /elsewhere/sparsecomm"]
    monkeypatch.setattr(build_stamp, "_imported_from", lambda: None)
    assert stale(checkout) == ["sparsecomm is not installed in this environment"]


def test_an_extension_that_does_not_load_means_build(checkout):
    root, stamp = checkout
    reasons = build_stamp.stale_reasons(stamp, str(root), load=True)
    assert len(reasons) == 1 and reasons[0].startswith(
        os.path.relpath(build_stamp.extension_path(str(root)), root) + " does not load: "), reasons


def test_the_real_extension_loads_where_it_was_built(tmp_path):
    """The check loads the built extension by path with torch, as setup.sh runs it (a process of
    its own: the test process has loaded it already)."""
    real = build_stamp.extension_path(ROOT)
    if not os.path.exists(real):
        pytest.skip("the extension is not built in this checkout")
    root = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "csrc"), root / "csrc")
    (root / "sparsecomm").mkdir()
    shutil.copy2(real, build_stamp.extension_path(str(root)))
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("build_stamp", {os.path.join(ROOT, "scripts", "build_stamp.py")!r})
        b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
        b._imported_from = lambda: {str(root / "sparsecomm")!r}
        b.write(sys.argv[1], {str(root)!r})
        print(b.stale_reasons(sys.argv[1], {str(root)!r}, load=True))
    """)
    env = {k: v for k, v in os.environ.items() if k not in build_stamp.BUILD_ENV}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "stamp.json")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


# what pip -v prints while it builds: setuptools' compiler lines for the C kernels, ninja's for the bindings
PIP_OUTPUT = [
    "  running build_ext\n",
    "  gcc -Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall -fPIC -Icsrc/include -c csrc/cpu/topk.c -o build/topk.o "
    "-std=gnu11\n",
    "  building 'sparsecomm._C' extension\n",
    f"  [1/2] c++ -MMD -MF /tmp/b/csrc/ops.o.d -O3 -c {ROOT}/csrc/ops.cpp -o /tmp/b/csrc/ops.o -O3 -fopenmp\n",
    "  csrc/ops.cpp:10:1: warning: something\n",
    "Successfully installed sparsecomm-0.1.0\n",
]


def test_progress_is_one_line_per_compiled_source_and_the_log_keeps_everything(tmp_path):
    out = io.StringIO()
    build_stamp.progress(str(tmp_path / "build.log"), lines=iter(PIP_OUTPUT), out=out, total=3)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["setup:   [1/3] csrc/cpu/topk.c", "setup:   [2/3] csrc/ops.cpp"]
    assert (tmp_path / "build.log").read_text() == "".join(PIP_OUTPUT)


def test_progress_on_a_terminal_is_one_line_rewritten(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    build_stamp.progress(str(tmp_path / "build.log"), lines=iter(PIP_OUTPUT), out=out, total=3)
    assert out.getvalue().count("\n") == 1 and out.getvalue().count("\r") == 2
