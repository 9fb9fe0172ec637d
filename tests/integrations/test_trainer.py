"""GradschedTrainer against the Hugging Face Trainer with PyTorch's DDP, with the real
transformers and Accelerate (a 2-layer BERT, random init, nothing downloaded), 2 gloo ranks
(workers/with_trainer.py): gradient accumulation, max_grad_norm, evaluation every 2 steps, a checkpoint
saved mid-run that loads with from_pretrained.

Tolerance: 1e-6 absolute (weights move by about 1e-2; the runs are identical here).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the accelerate extra is not installed: pip install 'gradsched[accelerate]'")

from workers.launch import run_worker

TOLERANCE = 1e-6
POLICIES = ("fifo", "priority", "bytescheduler", "prophet")


def test_gradsched_trainer_equals_the_trainer_with_ddp(tmp_path):
    report = run_worker("with_trainer", tmp_path)
    assert report["moved"] > 1e-3
    assert len(report["ddp_evals"]) == 3 and "model.safetensors" in report["ddp_checkpoint"]
    for policy in POLICIES:
        assert report["cases"][policy] <= TOLERANCE, policy
        assert report["evals"][policy] == pytest.approx(report["ddp_evals"], abs=TOLERANCE), policy
        checkpoint = report["checkpoints"][policy]
        assert checkpoint["files"] == report["ddp_checkpoint"], policy
        assert checkpoint["diff"] <= TOLERANCE, policy
        assert checkpoint["wrapped"] == "gradsched.runtime.frontend.ddp" and checkpoint["is_ddp"], policy  # ours, a DDP
        assert report["rounds"][policy] == 6, policy  # 6 steps of 2 micro-steps: one communicating backward each
