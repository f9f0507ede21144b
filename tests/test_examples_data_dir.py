"""An example's --data-dir that does not hold its data set is an error, never generated data.

The image examples (train_image.py, train_lightning.py, train_accelerate.py) read CIFAR from
--data-dir; a folder without it stops the run before any rank starts (exit status 2, argparse's)
with a message naming the expected files and where to get them. Examples that read no data set
(the demo, digits) take no --data-dir at all. Nothing here starts a rank: a few seconds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = ("Expected in that folder: CIFAR-10's python batches data_batch_1 .. data_batch_5 and test_batch "
            "(cifar-10-python.tar.gz unpacks them into cifar-10-batches-py/), or the binary version "
            "data_batch_1.bin .. data_batch_5.bin and test_batch.bin (cifar-10-binary.tar.gz: cifar-10-batches-bin/); "
            "CIFAR-100: train and test, or train.bin and test.bin. Download from "
            "https://www.cs.toronto.edu/~kriz/cifar.html, or leave out --data-dir to train on generated "
            "CIFAR-shaped data.")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--nproc", "2", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def _refused(proc: subprocess.CompletedProcess, data_dir, why: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.endswith(f"error: --data-dir {data_dir}: no CIFAR data set there ({why}). {EXPECTED}"), error
    assert "GENERATED" not in proc.stdout and "updates" not in proc.stdout, proc.stdout


def _train_image():
    """examples/train_image.py as a module (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("train_image", os.path.join(ROOT, "examples", "train_image.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout,why", [
    ("missing", "there is no such folder"),
    ("empty", "the folder is empty"),
    ("partial", "it has part of the CIFAR-10 python batches but not data_batch_3, data_batch_4, data_batch_5, "
                "test_batch"),
    ("partial binary", "it has part of the CIFAR-10 binary version but not test_batch.bin"),
    ("other files", "it holds none of their files (it has notes.txt)"),
    ("parent", "it holds cifar-10-batches-py/: pass --data-dir {}"),
])
def test_the_error_names_what_the_folder_lacks(tmp_path, layout, why):
    data_dir = tmp_path / "cifar"
    if layout != "missing":
        data_dir.mkdir()
    for name in {"partial": ["data_batch_1", "data_batch_2"], "other files": ["notes.txt"],
                 "partial binary": [f"data_batch_{i}.bin" for i in range(1, 6)]}.get(layout, []):
        (data_dir / name).write_bytes(b"")
    if layout == "parent":
        (data_dir / "cifar-10-batches-py").mkdir()
        why = why.format(data_dir / "cifar-10-batches-py")
    error = _train_image().data_dir_error(str(data_dir))
    assert error == f"--data-dir {data_dir}: no CIFAR data set there ({why}). {EXPECTED}"


def test_no_data_dir_is_generated_data_and_a_full_one_is_no_error(tmp_path):
    module = _train_image()
    assert module.data_dir_error(None) is None
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (tmp_path / name).write_bytes(b"")
    assert module.data_dir_error(str(tmp_path)) is None


def test_train_image_stops_before_any_rank_starts(tmp_path):
    _refused(_run("train_image.py", "--bandwidth", "none", "--steps", "1", "--data-dir", str(tmp_path / "no")),
             tmp_path / "no", "there is no such folder")


@pytest.mark.parametrize("script,extra", [("train_lightning.py", "lightning"), ("train_accelerate.py", "accelerate")])
def test_the_other_image_examples_refuse_it_too(tmp_path, script, extra):
    pytest.importorskip(extra, reason=f"{extra} is not installed (pip install '.[{extra}]')")
    _refused(_run(script, "--steps", "1", "--data-dir", str(tmp_path)), tmp_path, "the folder is empty")


@pytest.mark.parametrize("script", ["ddp_demo.py", "train_digits.py"])
def test_examples_that_read_no_data_set_take_no_data_dir(tmp_path, script):
    proc = _run(script, "--data-dir", str(tmp_path))
    assert proc.returncode == 2 and "unrecognized arguments: --data-dir" in proc.stderr, proc.stderr
