"""examples/minimal_ddp.py, the README's quick start as a program: it runs on 2 ranks under
torchrun and under sparsecomm.launch (resuming the first run's checkpoints), and every code line
of the README's quick start is a line of it, so the two cannot drift apart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "minimal_ddp.py")
CAN_LAUNCH = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
# MLP 64-128-10: 9610 parameters, one bucket; dense ring allreduce at P = 2: 4 x 9610 B = 38.4 kB
SUMMARY = (r"step {}: topka, density 0\.01: sent \d+ B = 0\.0\d+x dense's 38\.4 kB, 1 bucket(?: \(\+\d+ B setup\))?; "
           r"loss [\d.]+")


def _code_lines(text: str) -> list[str]:
    """The code of each line (its comment and indentation dropped), blank and comment-only lines left out."""
    out = []
    for line in text.splitlines():
        code = re.split(r"\s+#\s", line.strip(), maxsplit=1)[0].strip()
        if code and not code.startswith("#"):
            out.append(code)
    return out


def test_the_readme_quick_start_is_the_example():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("## Quick start"):]
    start = section.index("```python") + len("```python")
    snippet = section[start:section.index("```", start)]
    assert "examples/minimal_ddp.py" in section[:section.index("\n## ", 3)], "the quick start names the file"
    example = set(_code_lines(open(SCRIPT).read()))
    missing = [line for line in _code_lines(snippet) if line not in example]
    assert not missing, f"README quick start lines not in examples/minimal_ddp.py: {missing}"
    # the lines that carry the quick start are among them
    for key in ('dist.init_process_group("gloo")', 'state = sc.DDPHookState("topka", density=0.01)',
                "sc.register(model, state)", 'saved = torch.load(f"ckpt_rank{rank}.pt")'):
        assert key in _code_lines(snippet), key


def _env() -> dict:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}


def test_two_ranks_under_torchrun_then_resumed_under_sparsecomm_launch(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed: no digits data")
    # 1500 training digits, 750 per rank, batch 32: 23 steps per epoch; 6 steps, a line every 3
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT,
                "--steps", "6", "--log-every", "3"]
    first = subprocess.run(torchrun, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = [line for line in first.stdout.splitlines() if line.startswith(("step ", "done"))]
    assert len(lines) == 3, first.stdout
    assert re.fullmatch(SUMMARY.format(3), lines[0]) and re.fullmatch(SUMMARY.format(6), lines[1]), first.stdout
    assert re.fullmatch(r"done: 2 ranks, hook step 6, held-out accuracy [\d.]+; saved ckpt_rank0\.pt \.\. "
                        r"ckpt_rank1\.pt", lines[2]), first.stdout
    assert sorted(os.listdir(tmp_path)) == ["ckpt_rank0.pt", "ckpt_rank1.pt"]
    if not CAN_LAUNCH:
        pytest.skip("sparsecomm.launch needs root and iproute2 (ip, tc)")
    launch = [sys.executable, "-m", "sparsecomm.launch", "--nproc", "2", "--bandwidth", "none", "--", sys.executable,
              SCRIPT, "--steps", "3", "--log-every", "3", "--resume"]
    resumed = subprocess.run(launch, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rank0 = [line[len("[rank 0] "):] for line in resumed.stdout.splitlines() if line.startswith("[rank 0] ")]
    assert rank0[0] == "resumed from ckpt_rank<r>.pt after step 6", resumed.stdout
    assert re.fullmatch(SUMMARY.format(9), rank0[1]) and rank0[2].startswith("done: 2 ranks, hook step 9,"), \
        resumed.stdout
