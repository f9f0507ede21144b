"""The training examples run end to end; the digits example converges with spardl at 1%.

About 40-60 s on a 2-core machine (the digits run is most of it), and 30 s more for the
Accelerate example's three runs (save, resume, one process), when Accelerate is installed.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r"^\| (\w+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) MB \| (\S+) \| ([\d.]+)% \|$", re.MULTILINE)


def _run(script: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--nproc", "2",
                           "--bandwidth", "none", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return proc


def _rows(stdout: str) -> dict[str, re.Match]:
    return {m.group(1): m for m in ROW.finditer(stdout)}


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                    reason="scikit-learn is not installed (pip install scikit-learn): no digits data")
def test_digits_spardl_at_one_percent_within_one_point_of_dense():
    proc = _run("train_digits.py", "--algorithms", "dense", "spardl", "--density", "0.01")
    rows = _rows(proc.stdout)
    assert sorted(rows) == ["dense", "spardl"], proc.stdout
    dense, spardl = float(rows["dense"].group(7)), float(rows["spardl"].group(7))
    assert dense > 93.0, proc.stdout  # the MLP really learned the real data
    assert spardl >= dense - 1.0, proc.stdout
    assert float(rows["spardl"].group(5)) * 20 < float(rows["dense"].group(5)), "spardl should send far fewer bytes"


def test_image_resnet20_on_generated_data():
    proc = _run("train_image.py", "--model", "resnet20", "--algorithm", "spardl", "--density", "0.01",
                "--steps", "3", "--batch", "4", "--train-size", "32", "--test-size", "16")
    assert "GENERATED DATA" in proc.stdout
    rows = _rows(proc.stdout)
    assert list(rows) == ["spardl"], proc.stdout
    assert int(rows["spardl"].group(3)) == 3 and math.isfinite(float(rows["spardl"].group(6)))
    assert float(rows["spardl"].group(5)) > 0
    assert "loss finite: True" in proc.stdout


def test_image_compares_algorithms_and_pytorch_hooks_in_one_run():
    names = ["dense", "topka", "torch_fp16", "torch_powersgd"]
    proc = _run("train_image.py", "--model", "resnet20", "--algorithms", *names, "--density", "0.01",
                "--steps", "4", "--batch", "4", "--train-size", "32", "--test-size", "16")
    table = proc.stdout[proc.stdout.index("updates each:"):]
    compared = {m[0]: (int(m[1]), float(m[2])) for m in
                re.findall(r"^\| (\w+)[^|]* \| (\d+) \| ([\d.]+)x \|", table, re.MULTILINE)}
    assert sorted(compared) == sorted(names), proc.stdout
    # bytes per rank per update: ResNet-20 (option A shortcuts, no parameters) has 269,722
    # parameters; at P = 2 a ring allreduce of B bytes sends 2 (P - 1) ceil(B / P) = B bytes
    # (the table prints 100-byte resolution: a wrong element size or P shows, one parameter does not)
    params = (3 * 16 * 9 + 2 * 16 + 3 * 2 * (16 * 16 * 9 + 2 * 16)
              + (16 * 32 * 9 + 2 * 32) + (32 * 32 * 9 + 2 * 32) + 2 * 2 * (32 * 32 * 9 + 2 * 32)
              + (32 * 64 * 9 + 2 * 64) + (64 * 64 * 9 + 2 * 64) + 2 * 2 * (64 * 64 * 9 + 2 * 64) + 64 * 10 + 10)
    per_run = _rows(proc.stdout)
    assert per_run["dense"].group(5) == f"{2 * math.ceil(4 * params / 2) / 1e6:.4f}", per_run["dense"].group(0)
    assert per_run["torch_fp16"].group(5) == f"{2 * math.ceil(2 * params / 2) / 1e6:.4f}", per_run["torch_fp16"].group(0)
    # each speedup is dense's per-update time over the row's: the printed whole milliseconds
    # bound the ratio, the speedup is printed to 0.01
    dense_ms = compared["dense"][0]
    for name, (ms, speedup) in compared.items():
        low, high = (dense_ms - 0.5) / (ms + 0.5), (dense_ms + 0.5) / (ms - 0.5)
        assert low - 0.005 <= speedup <= high + 0.005, (name, dense_ms, ms, speedup)


_LM_ROW = re.compile(r"^\| (\w+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) MB \| (\S+) \| ([\d.]+) \| "
                     r"([\d.]+)% \|$", re.MULTILINE)


def test_lstm_language_model_on_the_shipped_wikitext2():
    proc = _run("train_lstm.py", "--algorithm", "topka", "--density", "0.01", "--steps", "3", "--batch", "4",
                "--bptt", "10", "--hidden", "16", "--eval-tokens", "2000")
    assert "REAL: WikiText-2" in proc.stdout and "GENERATED" not in proc.stdout, proc.stdout
    rows = {m.group(1): m for m in _LM_ROW.finditer(proc.stdout)}
    assert list(rows) == ["topka"], proc.stdout
    assert int(rows["topka"].group(3)) == 3 and float(rows["topka"].group(5)) > 0
    perplexity = float(rows["topka"].group(7))
    assert 1 < perplexity < 2 * 14_143, proc.stdout   # at most about a uniform guess over the vocabulary
    # the first 2000 held-out tokens, each rank its half: 2 ranks x 10 streams x 10 segments of 10 tokens
    assert f"held-out perplexity: {perplexity:.2f} on 2,000 tokens of valid.txt" in proc.stdout, proc.stdout
    assert "loss finite: True" in proc.stdout


@pytest.mark.parametrize("files", [[], ["test.txt"], ["train.txt", "valid.txt"]])
def test_lstm_refuses_a_data_dir_without_wikitext2(tmp_path, files):
    for name in files:
        (tmp_path / name).write_text("a b c\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_lstm.py"), "--data-dir", str(tmp_path),
                           "--steps", "1", "--bandwidth", "none", "--no-progress"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    missing = [name for name in ("test.txt", "valid.txt") if name not in files]
    assert f"holds no WikiText-2 {' and '.join(missing)}" in proc.stderr, proc.stderr
    assert "test.txt (trains) and valid.txt (held out)" in proc.stderr, proc.stderr
    assert "GENERATED" not in proc.stdout and "updates" not in proc.stdout


def test_image_reads_cifar_binary_batches(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}.bin", 8) for i in range(1, 6)), ("test_batch.bin", 8)]:
        rows = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], axis=1)
        rows.astype(np.uint8).tofile(tmp_path / name)
    proc = _run("train_image.py", "--model", "resnet20", "--algorithm", "dense", "--steps", "2", "--batch", "4",
                "--data-dir", str(tmp_path))
    assert "CIFAR-10 (binary)" in proc.stdout and "GENERATED" not in proc.stdout
    assert "loss finite: True" in proc.stdout


# state.summary() of the hook step, then the loss
_STEP = re.compile(r"^step (\d+): topka, density 0\.01: sent ([\d.]+ k?B) = ([\d.]+)x dense's ([\d.]+ [kM]B), (\d+) "
                   r"buckets?(?: \(\+\d+ B setup\))?; loss ([\d.]+)$", re.MULTILINE)


def test_accelerate_two_processes_save_and_resume_print_the_same_steps(tmp_path):
    pytest.importorskip("accelerate", reason="Hugging Face Accelerate is not installed (pip install "
                                             "accelerate>=1.0'): train_accelerate.py cannot run")
    small = ["--algorithm", "topka", "--steps", "4", "--batch", "4", "--train-size", "32", "--test-size", "16"]
    first = _run("train_accelerate.py", *small, "--save-state", str(tmp_path), "--save-every", "2").stdout
    steps = _STEP.findall(first)
    assert [int(s[0]) for s in steps] == list(range(1, 5)), first   # a hook step per optimizer step
    assert all(0 < float(s[2]) < 1 for s in steps), first           # sent, far fewer bytes than dense
    assert "GENERATED DATA" in first and "MULTI_CPU" in first
    resumed = _run("train_accelerate.py", *small, "--resume", str(tmp_path / "step2")).stdout
    assert f"resumed from {tmp_path / 'step2'} after step 2" in resumed, resumed
    assert _STEP.findall(resumed) == steps[2:], resumed   # the same losses and bytes
    alone = _run("train_accelerate.py", *small[:2], "--steps", "1", "--batch", "4", "--train-size", "8",
                 "--test-size", "8", "--nproc", "1")
    assert "step 1: not reduced (1 process: no hook); loss" in alone.stdout, alone.stdout
    assert alone.stderr.count("1-process run: there is nothing to reduce") == 1, alone.stderr
