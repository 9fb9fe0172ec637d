"""GradschedStrategy against Lightning's own DDPStrategy, with the real Lightning, 2 gloo
ranks (workers/with_lightning.py): automatic optimisation with gradient_clip_val and
accumulate_grad_batches, bf16-mixed, manual optimisation with clipping, an LR scheduler from
configure_optimizers; ``ddp_comm_hook=fp16_compress_hook`` against DDPStrategy with the same hook
(registered on CPU); past the hand-off to DDP's reducer, where Lightning's automatic
optimization steps with a closure; resume from a mid-run checkpoint, under gradsched and under DDP.

Tolerance: 1e-6 absolute (parameters move by 2e-2 to 3e-2; the runs are identical here).
"""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed: pip install 'gradsched[lightning]'")

from workers.launch import run_worker

TOLERANCE = 1e-6


def test_gradsched_strategy_equals_ddp_strategy(tmp_path):
    report = run_worker("with_lightning", tmp_path)
    assert report["clipping_bites"] > 1e-3
    assert all(moved > 1e-2 for moved in report["moved"].values())
    assert len(report["cases"]) == 3 * 4 + 2 + 1 + 2
    assert 4 < report["handed_off"] < 20  # trained past the hand-off with Lightning's closures
    assert report["hook_bites"] > 10 * TOLERANCE  # the fp16 hook's rounding shows
    for case, difference in report["cases"].items():
        assert difference <= TOLERANCE, case
    # 64 samples, 2 ranks, batch 8: 4 batches per rank and epoch, 2 epochs. Accumulating 2
    # batches per step, only the step's backward pass communicates; manual steps every batch.
    for case, rounds in report["rounds"].items():  # (the hand-off case not among them)
        assert rounds == (8 if case.startswith("manual") else 4), case
