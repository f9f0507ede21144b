"""Each example's run-length flags give the run their help promises: --steps N is N updates
whatever --epochs says (more than an epoch included), --epochs E is E passes over a rank's shard,
--accumulate A makes A micro-batches per optimizer step, the demo's --steps / --eval-every its
updates and evaluations. Every length below is written from the sizes passed (2 ranks, tiny
models and data sets), not read from the code; each example runs once or twice (about
3-4 minutes on a loaded 2-core machine, the Lightning and Accelerate runs skipped when absent).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# | algorithm | density | updates | per-update (ms) | bytes/step | final loss | test accuracy |
UPDATES = re.compile(r"^\| (\w+) \| [\d.]+ \| (\d+) \| ", re.MULTILINE)


def _run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--nproc", "2", *args],
                          capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# train_image: 32 generated images, 16 per rank, batch 4: 4 updates per epoch
IMAGE = ["--bandwidth", "none", "--no-progress", "--model", "resnet20", "--algorithm", "topka", "--batch", "4",
         "--train-size", "32", "--test-size", "16"]


@pytest.mark.parametrize("flags,updates", [(["--epochs", "2"], 8), (["--epochs", "1", "--steps", "6"], 6)])
def test_train_image(flags, updates):
    out = _run("train_image.py", *IMAGE, *flags)
    assert UPDATES.findall(out) == [("topka", str(updates))], out
    assert re.search(rf"^last update, rank 0: step {updates}: topka, density 0\.01: sent ", out, re.M), out


# train_digits: 1797 - 360 held out = 1437 images, 718 per rank, batch 32: 22 updates per epoch
@pytest.mark.parametrize("flags,updates", [(["--epochs", "1"], 22), (["--epochs", "1", "--steps", "30"], 30)])
def test_train_digits(flags, updates):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed: no digits data")
    out = _run("train_digits.py", "--bandwidth", "none", "--no-progress", "--algorithms", "topka", *flags)
    assert UPDATES.findall(out) == [("topka", str(updates))], out


def test_ddp_demo(tmp_path):
    # --steps 5, --eval-every 2: evaluations after 0, 2, 4 and 5 updates
    out = _run("ddp_demo.py", "--bandwidth", "none", "--no-progress", "--hidden", "32", "--algorithms", "dense",
               "--steps", "5", "--eval-every", "2", "--out", str(tmp_path))
    (dense,) = json.loads((tmp_path / "demo.json").read_text())["methods"]
    assert dense["updates"] == 5 and [p["updates"] for p in dense["curve"]] == [0, 2, 4, 5], out


# train_lightning: 64 generated images, 32 per rank (Lightning's DistributedSampler), batch 8: 4 steps per epoch
@pytest.mark.parametrize("flags,steps", [(["--epochs", "2"], 8), (["--steps", "6"], 6)])
def test_train_lightning(flags, steps):
    pytest.importorskip("lightning", reason="Lightning is not installed: pip install 'lightning>=2.2,<3'")
    out = _run("train_lightning.py", "--algorithm", "topka", "--batch", "8", "--train-size", "64", "--test-size", "16",
               "--log-every", "1", *flags)
    logged = [int(s) for s in re.findall(r"^step (\d+): topka, density 0\.01: sent .*; loss [\d.]+$", out, re.M)]
    assert logged == list(range(1, steps + 1)), out
    assert re.search(rf"^done: 2 processes, topka at density 0\.01, hook step {steps}, test accuracy ", out, re.M), out


# train_accelerate: 32 generated images, 16 per rank, batch 4: 4 micro-batches per epoch
@pytest.mark.parametrize("flags,steps", [(["--epochs", "2"], 8), (["--steps", "3", "--accumulate", "2"], 3)])
def test_train_accelerate(flags, steps):
    pytest.importorskip("accelerate", reason="Accelerate is not installed: pip install 'accelerate>=1.0'")
    out = _run("train_accelerate.py", "--bandwidth", "none", "--algorithm", "topka", "--batch", "4",
               "--train-size", "32", "--test-size", "16", *flags)
    assert f", {steps} optimizer steps" in out, out
    logged = [int(s) for s in re.findall(r"^step (\d+): topka, density 0\.01: sent .*; loss [\d.]+$", out, re.M)]
    assert logged == list(range(1, steps + 1)), out
    assert re.search(rf"hook steps {steps}$", out, re.M), out
