"""The GPU check (benchmarks/gpu_check.py) on CPU: every part runs (gloo, no streams) and every
row judged there passes; with a planted defect (tests/mutant) the rows named for it fail: a
transport that does not reduce fails the reduction rows, a completion that resolves messages
before their results are in place fails the rows over a slow link. Asked for CUDA where there
is none, it says so and exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def check(tmp_path, *args: str, mutant: str | None = None) -> tuple[int, list[dict]]:
    out = tmp_path / "check.json"
    env = dict(os.environ)
    if mutant is not None:
        env.update(GRADSCHED_MUTANT=mutant,
                   PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "mutant"), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text())["rows"]


def test_the_cpu_version_of_the_gpu_check_passes(tmp_path):
    code, rows = check(tmp_path)
    assert code == 0, [r for r in rows if r["ok"] is False]
    parts = {r["part"] for r in rows}
    assert parts == {"reduction", "overlap", "profile", "handoff", "host_syncs", "sync_bn", "end_to_end", "overhead"}
    judged = [r["check"] for r in rows if r["ok"] is True]
    assert sum(c.startswith("reduction") for c in judged) == 3 * 2 + 2  # fp32 and fp16, and the slow link
    assert sum(c.startswith("handoff") for c in judged) == 2  # values, and the flat buffers freed
    assert sum(c.startswith("end_to_end") for c in judged) == 8 + 1
    assert len([r for r in rows if r["check"].startswith("overhead")]) == 5  # DDP and every policy


@pytest.mark.parametrize("mutant, failing", [("no-reduction", "fp32"), ("early-resolve", "over a slow link")])
def test_the_reduction_rows_fail_on_a_planted_defect(tmp_path, mutant, failing):
    code, rows = check(tmp_path, "--parts", "reduction", mutant=mutant)
    assert code == 1
    named = [r for r in rows if r["check"].startswith("reduction") and r["check"].endswith(failing)]
    assert named and all(r["ok"] is False for r in named), rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
