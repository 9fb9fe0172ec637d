"""gradsched's Accelerate ``prepare`` and ``GradschedAccelerator`` against Accelerate's own DDP, with the real Accelerate
and transformers (a 2-layer BERT, random init, nothing downloaded), 2 gloo ranks
(workers/with_accelerate.py): accumulation, clipping, an LR scheduler, and a checkpoint from
``accelerator.save_state`` under gradsched resumed under DDP; ``accelerator.unwrap_model`` on
gradsched's wrapper; a communication hook asked for with ``DistributedDataParallelKwargs(comm_hook=FP16)``
against Accelerate's DDP with the same hook.

Tolerance: 1e-6 absolute (parameters move by about 2e-2; the runs are identical here).
"""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate", reason="the accelerate extra is not installed: pip install 'gradsched[accelerate]'")
pytest.importorskip("transformers", reason="the accelerate extra is not installed: pip install 'gradsched[accelerate]'")

from workers.launch import run_worker

TOLERANCE = 1e-6


def test_gradsched_prepare_equals_accelerates_ddp(tmp_path):
    report = run_worker("with_accelerate", tmp_path)
    assert report["moved"] > 1e-2
    assert len(report["cases"]) == 8
    assert report["hook_bites"] > 10 * TOLERANCE  # the fp16 hook's rounding shows
    for case, difference in report["cases"].items():
        assert difference <= TOLERANCE, case
    # 8 batches per rank, a step every 2: only the steps' backward passes communicate
    assert report["rounds"] == {policy: 4 for policy in ("fifo", "priority", "bytescheduler", "prophet")}
