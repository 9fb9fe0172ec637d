"""Elastic restart with nothing lost: under ``torchrun --max-restarts 1``, a worker and,
separately, a parameter server are killed (SIGKILL, from outside, as a lost machine) once
training has written its first checkpoint; torchrun restarts every rank, the example resumes
from its checkpoint, and the final parameters equal an uninterrupted run's exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ELASTIC_EXAMPLE, moved_by_elastic_example

from workers.launch import free_port

psutil = pytest.importorskip("psutil")
EXAMPLE = ELASTIC_EXAMPLE
# torchrun shares its rendezvous store with the workers' process group by default, and a
# restarted gloo group can then read a dead rank's address from the attempt before (PyTorch
# issue 135712): the example's docstring says to launch with this
RESTARTABLE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _train(tmp_path: Path, tag: str, nproc: int, extra: list[str], victim: int | None) -> tuple[str, dict]:
    checkpoint, final = tmp_path / f"{tag}.pt", tmp_path / f"{tag}-final.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(EXAMPLE), "--checkpoint", str(checkpoint), "--out", str(final),
           "--policy", "prophet", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **RESTARTABLE}, start_new_session=True)
    try:
        if victim is not None:
            deadline = time.monotonic() + 120
            while not checkpoint.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
                time.sleep(0.02)
            ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                     if EXAMPLE.name in " ".join(p.cmdline()) and p.environ().get("RANK") == str(victim)]
            assert len(ranks) == 1, ranks
            ranks[0].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return out, torch.load(final)


@pytest.mark.parametrize("victim", ["worker", pytest.param("server", marks=pytest.mark.slow)])  # CI: one victim
def test_a_killed_rank_restarts_and_resumes_to_the_uninterrupted_result(tmp_path, victim):
    nproc, extra, rank = (2, [], 1) if victim == "worker" else (3, ["--servers", "1"], 2)
    plain_out, plain = _train(tmp_path, "plain", nproc, extra, victim=None)
    killed_out, resumed = _train(tmp_path, "killed", nproc, extra, victim=rank)
    assert "resumed" not in plain_out
    assert "resumed from the checkpoint of step" in killed_out and "(restart 1)" in killed_out, killed_out
    assert "step 200 " in killed_out
    assert plain.keys() == resumed.keys()
    for name in plain:
        assert torch.equal(plain[name], resumed[name]), name
    assert moved_by_elastic_example(plain) > 1e-2  # training did something to compare

