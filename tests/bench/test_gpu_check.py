"""The GPU check (benchmarks/gpu_check.py) keeps working where there is no GPU: its CPU version
runs every part (gloo, no streams, a small ResNet-50 input) and every judged check passes;
asked for CUDA where there is none, it says so and exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_the_cpu_version_of_the_gpu_check_passes(tmp_path):
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    checks = {r["check"].split()[0] for r in rows}
    assert checks == {"(a)", "(b)", "(c)", "(d)", "(e)"}
    assert sum(r["ok"] is True for r in rows) >= 4 + 8 + 4 + 1  # streams, end to end, two ranks, the trial
    assert not [r for r in rows if r["ok"] is False]
    assert len([r for r in rows if r["check"].startswith("(e)")]) == 5  # DDP and every policy


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
